"""RL-rollout workload: all at t=0, long-tailed and capped output lengths."""

from __future__ import annotations

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.traces.rollout import RolloutConfig, rollout_output_lens, rollout_workload


@pytest.mark.parametrize(
    "config",
    [
        # lognormal, median 1024, sigma 1
        RolloutConfig(
            num_requests=20_000, output_median=1024, output_sigma=1.0, max_output_len=16384
        ),
        # Pareto alpha 1.5 from 256
        RolloutConfig(
            num_requests=20_000,
            output_dist="pareto",
            pareto_alpha=1.5,
            pareto_min_len=256,
            max_output_len=16384,
        ),
    ],
)
def test_output_lengths_are_long_tailed_and_capped(config: RolloutConfig) -> None:
    lengths = rollout_output_lens(config, np.random.default_rng(0))
    assert lengths.min() >= 1 and lengths.max() <= config.max_output_len
    median = np.median(lengths)
    # long tail: p99 far above the median, mean above the median
    assert np.percentile(lengths, 99) > 5 * median
    assert lengths.mean() > median
    # the cap is reached by some requests (they are the truncated ones)
    assert (lengths == config.max_output_len).any()


def test_lognormal_median_and_pareto_minimum_match_parameters() -> None:
    lognormal = rollout_output_lens(
        RolloutConfig(num_requests=50_000, output_median=500, output_sigma=0.8),
        np.random.default_rng(1),
    )
    assert np.median(lognormal) == pytest.approx(500, rel=0.03)
    pareto = rollout_output_lens(
        RolloutConfig(
            num_requests=50_000, output_dist="pareto", pareto_alpha=2.0, pareto_min_len=100
        ),
        np.random.default_rng(1),
    )
    assert pareto.min() == 100
    # P(X > 2 x_min) = 2^-alpha = 0.25
    assert (pareto > 200).mean() == pytest.approx(0.25, abs=0.01)


def test_rollout_is_all_at_zero_with_fixed_or_dataset_prompts() -> None:
    fixed = rollout_workload(
        RolloutConfig(num_requests=64, prompt_len=300), rng=np.random.default_rng(0)
    )
    assert len(fixed.requests) == 64 and fixed.max_concurrency is None
    assert all(r.arrival_s == 0.0 and r.prompt_len == 300 for r in fixed.requests)
    from_set = rollout_workload(
        RolloutConfig(num_requests=100, prompt_set="gsm8k"), rng=np.random.default_rng(0)
    )
    assert all(r.prompt and r.tag == "math" for r in from_set.requests)


def test_rollout_is_seeded() -> None:
    config = RolloutConfig(num_requests=100)
    assert rollout_workload(config, rng=np.random.default_rng(9)) == rollout_workload(
        config, rng=np.random.default_rng(9)
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_requests": 0}, "num_requests"),  # empty batch
        ({"output_dist": "zipf"}, "output_dist"),  # unknown family
        ({"output_sigma": 0.0}, "output_sigma"),  # degenerate lognormal
        ({"pareto_alpha": -1.0}, "pareto_alpha"),  # invalid tail index
        ({"max_output_len": 0}, "max_output_len"),  # cap below one token
        ({"prompt_set": "nope"}, "prompt_set"),  # unknown prompt set
    ],
)
def test_bad_rollout_config_raises(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=field):
        RolloutConfig(**kwargs)  # type: ignore[arg-type]
