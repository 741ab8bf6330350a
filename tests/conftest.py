"""Shared pytest configuration: hypothesis profiles, the gpu marker's skip, torch's threads,
dsd's disk memo in a temporary folder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

# Torch CPU ops on tiny test models are dominated by thread spin-up when two pytest workers share
# two cores; one thread per worker is much faster. Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# vLLM resolves its platform once per process, at the first use of any of its configs: every
# test that touches vLLM (the oracle, check-policy, its SchedulerConfig) must find the CPU one.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import pytest
from hypothesis import HealthCheck, settings

# `dev`: the default, quick. `ci`: what CI runs (CI set; bounded time on 2 cores). `thorough`:
# long local runs (HYPOTHESIS_PROFILE=thorough pytest ...). The stateful scheduler machines
# (tests/sim/test_stateful.py) run a multiple of max_examples (10x over the three machines: ci
# = 2,000 machine examples) with the profile's stateful_step_count rules per example.
settings.register_profile("dev", max_examples=50, deadline=None, stateful_step_count=30)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    stateful_step_count=40,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=5000,
    deadline=None,
    stateful_step_count=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="session")
def _dsd_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """dsd's disk memo (dsd.common.disk_memo) in a fresh folder per session (and per xdist
    worker): tests never read or fill the user's ~/.cache/dsd."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DSD_CACHE_DIR", str(tmp_path_factory.mktemp("dsd-cache")))
        yield


@pytest.fixture
def load_benchmark(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`load_benchmark("name")`: the module benchmarks/name.py (benchmarks is not a package;
    its folder goes on sys.path for the scripts that import a sibling)."""
    import importlib.util
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))

    def load(name: str):  # type: ignore[no-untyped-def]
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """Set torch's intra-op threads inside a test; the count before is restored after it."""
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
