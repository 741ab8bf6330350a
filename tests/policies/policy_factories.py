"""Profile factories for policy tests: small valid profiles with sane defaults."""

from __future__ import annotations

from pathlib import Path

from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.profile_io import load_profile

PROFILES_DIR = Path(__file__).resolve().parents[2] / "policies" / "profiles"
H100_PROFILE = PROFILES_DIR / "pr32374_llama31_8b_eagle_h100.json"
FIXTURE_PROFILE = PROFILES_DIR / "pr32374_branch_test_fixture.json"


def h100_profile() -> Profile:
    return load_profile(H100_PROFILE)


def fixture_profile() -> Profile:
    return load_profile(FIXTURE_PROFILE)


def make_profile(
    itl_ms: dict[int, dict[int, float]],
    acceptance_rates: tuple[float, ...],
) -> Profile:
    """A profile from a {B: {K: ITL ms}} table and rates (k_max = len(rates))."""
    latency = tuple(
        LatencyPoint(batch_size=b, num_spec_tokens=k, median_ms=ms)
        for b, row in sorted(itl_ms.items())
        for k, ms in sorted(row.items())
    )
    return Profile(k_max=len(acceptance_rates), latency=latency, acceptance_rates=acceptance_rates)
