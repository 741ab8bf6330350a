"""Metric definitions equal `vllm bench serve`'s."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsd.sim.metrics import bench_metrics_from
from dsd.sim.pooled import PooledValues
from dsd.sim.scheduler import SpecDecodeStats


def metrics(**overrides):
    params = {
        "prompt_len": np.array([10, 20, 30]),
        "num_output_tokens": np.array([1, 5, 9]),
        "ttft_s": np.array([0.1, 0.2, 0.3]),
        "tpot_s": np.array([0.01, 0.02]),
        "tpot_in_prefill_steps_s": np.array([0.0, 0.004]),
        "itl_s": np.array([0.01, 0.02, 0.03, 0.04]),
        "e2el_s": np.array([0.1, 0.28, 0.46]),
        "duration_s": 2.0,
        "spec_stats": SpecDecodeStats(k_max=2),
        "k_histogram": np.array([4, 0, 2]),
        "num_steps": 6,
    }
    params.update(overrides)
    params["itl_ms"] = PooledValues.of(params.pop("itl_s") * 1000.0)
    return bench_metrics_from(**params)


def test_throughputs_divide_by_duration():
    m = metrics()
    assert m["completed"] == 3
    assert m["total_input_tokens"] == 60
    assert m["total_output_tokens"] == 15
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(7.5)
    assert m["total_token_throughput"] == pytest.approx(37.5)


def test_stats_use_population_std_and_linear_percentiles_in_ms():
    m = metrics()
    itl_ms = np.array([10.0, 20.0, 30.0, 40.0])
    assert m["mean_itl_ms"] == pytest.approx(25.0)
    assert m["median_itl_ms"] == pytest.approx(25.0)
    assert m["std_itl_ms"] == pytest.approx(float(np.sqrt(((itl_ms - 25) ** 2).mean())))
    assert m["p99_itl_ms"] == pytest.approx(30.0 + 0.97 * 10.0)  # rank 0.99 * 3 = 2.97
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_tpot_ms"] == pytest.approx(15.0)


def test_empty_lists_read_as_zero_like_vllm():
    m = metrics(tpot_s=np.zeros(0), tpot_in_prefill_steps_s=np.zeros(0), itl_s=np.zeros(0))
    assert m["mean_tpot_ms"] == 0.0
    assert m["mean_tpot_in_prefill_steps_ms"] == 0.0
    assert m["p99_itl_ms"] == 0.0


def test_tpot_in_prefill_steps_is_a_mean_over_the_tpot_requests_in_ms():
    assert metrics()["mean_tpot_in_prefill_steps_ms"] == pytest.approx(2.0)


def test_extra_percentiles_get_vllm_key_names():
    m = metrics(percentiles=(50.0, 99.9))
    assert "p50_ttft_ms" in m and "p99.9_ttft_ms" in m and "p99_ttft_ms" not in m


# (drafted per row, accepted per row, k_max) -> vLLM bench's meanings of its keys
# (vllm/benchmarks/serve.py 0.33: rate in percent; AL and per-position over num_drafts) and ours
# under our own names (AL NaN without drafts; per position over what was drafted there).
SPEC_DECODE_CASES = [
    pytest.param(
        [2, 2, 1, 0], [2, 0, 1, 0], 2,
        dict(rate=100 * 3 / 5, al=2.0, per_pos=[2 / 3, 1 / 3], our_al=2.0, given=[2 / 3, 1 / 2]),
        id="some rows draft fewer",
    ),
    pytest.param(
        [1, 1, 3, 3], [1, 1, 3, 3], 3,  # half K = 1, half K = 3, all accepted
        dict(rate=100.0, al=3.0, per_pos=[1.0, 0.5, 0.5], our_al=3.0, given=[1.0, 1.0, 1.0]),
        id="K varies: vLLM reads later positions low",
    ),
    pytest.param(
        [0, 0], [0, 0], 2,
        dict(rate=math.nan, al=0.0, per_pos=[], our_al=math.nan, given=[math.nan, math.nan]),
        id="no drafts",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("drafted", "accepted", "k_max", "want"), SPEC_DECODE_CASES)
def test_spec_decode_keys_mean_what_vllm_bench_means(drafted, accepted, k_max, want) -> None:
    stats = SpecDecodeStats(k_max=k_max)
    stats.observe(np.array(drafted), np.array(accepted))
    m = metrics(spec_stats=stats)
    assert m["spec_decode_acceptance_rate"] == pytest.approx(want["rate"], nan_ok=True)
    assert m["spec_decode_acceptance_length"] == pytest.approx(want["al"])
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx(want["per_pos"])
    assert m["acceptance_length"] == pytest.approx(want["our_al"], nan_ok=True)
    assert m["per_position_acceptance_given_drafted"] == pytest.approx(want["given"], nan_ok=True)


def test_spec_decode_keys():
    stats = SpecDecodeStats(k_max=2)
    stats.observe(np.array([2, 2, 1, 0]), np.array([2, 0, 1, 0]))
    m = metrics(spec_stats=stats)
    assert m["spec_decode_num_drafts"] == 3
    assert m["spec_decode_draft_tokens"] == 5
    assert m["k_histogram"] == {0: 4, 2: 2}


@pytest.mark.parametrize(
    ("block_rows", "compact_steps", "compact_chunks"),
    [
        (1 << 16, 1 << 13, 1 << 18),  # the defaults: blocks grow past 256 rows
        (100, 7, 1 << 18),  # blocks close, compactions every 7 steps inside the stretch
        (1 << 16, 1 << 13, 10),  # compactions at 10 pending chunks (4 steps of 3 rows)
    ],
)
def test_plain_decode_steps_recorded_at_once_equal_the_same_steps_one_by_one(
    block_rows: int, compact_steps: int, compact_chunks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`record_plain_decode_steps` records what `record_step` does for the same steps (every
    row at K = 0 emitting one token, nothing finishing): rows, chunks, ITLs and K counts, and
    it compacts after the same steps."""
    import dsd.sim.metrics as metrics_module
    from dsd.sim.metrics import MetricsRecorder
    from dsd.sim.scheduler import StepResult
    from dsd.sim.types import ScheduledBatch

    monkeypatch.setattr(metrics_module, "STEP_BLOCK_ROWS", block_rows)
    monkeypatch.setattr(metrics_module, "COMPACT_MAX_STEPS", compact_steps)
    monkeypatch.setattr(metrics_module, "COMPACT_MIN_CHUNKS", compact_chunks)
    compactions: dict[int, list[int]] = {}  # recorder id -> chunks so far at each compaction
    compact = MetricsRecorder._compact

    def counted(self: MetricsRecorder) -> None:
        seen = int(self._num_chunks.sum()) + self._num_pending_chunks
        compactions.setdefault(id(self), []).append(seen)
        compact(self)

    monkeypatch.setattr(MetricsRecorder, "_compact", counted)
    req_ids = np.array([3, 0, 2], dtype=np.int64)  # running rows, in batch order
    duration_s, num_steps = 0.0123, 700
    starts_s = [0.5]
    for _ in range(num_steps - 1):
        starts_s.append(starts_s[-1] + duration_s)

    def recorder() -> MetricsRecorder:
        metrics = MetricsRecorder(5, k_max=3)
        metrics.record_sends(range(5), 0.0, [4] * 5)
        return metrics

    one_by_one, at_once = recorder(), recorder()
    ones = np.ones(3, dtype=np.int64)
    for offset, start_s in enumerate(starts_s):
        batch = ScheduledBatch(
            step_index=10 + offset,
            req_ids=req_ids,
            num_decode_reqs=3,
            num_scheduled_tokens=ones,
            num_spec_tokens=np.zeros(3, dtype=np.int64),
            num_computed_tokens=ones,
            num_output_tokens=ones,
            completes_prompt=np.zeros(3, dtype=np.bool_),
            total_num_scheduled_tokens=3,
        )
        result = StepResult(10 + offset, req_ids, ones.copy(), (), 0)
        assert one_by_one.record_step(batch, result, start_s, duration_s) == 3
    at_once.record_plain_decode_steps(req_ids, 10, starts_s, duration_s)
    # compactions while recording (reading the tables below compacts again)
    while_recording = [list(compactions.get(id(m), [])) for m in (one_by_one, at_once)]
    for metrics in (one_by_one, at_once):  # requests 0, 2, 3 finish where the steps end
        metrics.finish_s[[0, 2, 3]] = starts_s[-1] + duration_s
    assert one_by_one.num_steps == at_once.num_steps == num_steps
    for name, column in one_by_one.step_columns().items():
        assert column.tolist() == at_once.step_columns()[name].tolist(), name
    for name, column in one_by_one.request_columns().items():
        np.testing.assert_array_equal(column, at_once.request_columns()[name], err_msg=name)
    assert one_by_one.k_histogram.tolist() == at_once.k_histogram.tolist() == [2100, 0, 0, 0]
    assert one_by_one.itl_ms().summary((99.0,)) == at_once.itl_ms().summary((99.0,))
    assert while_recording[0] == while_recording[1]
    defaults = (compact_steps, compact_chunks) == (1 << 13, 1 << 18)
    assert len(while_recording[1]) >= (0 if defaults else 5)  # inside the stretch
