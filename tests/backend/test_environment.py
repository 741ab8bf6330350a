"""Where a profile was taken against where it is applied (backend.environment)."""

from __future__ import annotations

from dsd.backend import environment
from dsd.backend.environment import machine_differences, warn_if_elsewhere

THEN = {
    "device": "cpu (AMD EPYC 7B13)",
    "dtype": "float32",
    "threads": {"torch_intra_op_threads": 1},
}


def test_the_same_machine_differs_in_nothing_and_unrecorded_keys_are_not_compared() -> None:
    assert machine_differences(THEN, dict(THEN)) == []
    assert machine_differences({}, THEN) == []  # a PR #32374 profile records no machine
    assert machine_differences(THEN, {"device": THEN["device"]}) == []


def test_each_difference_names_its_key_then_and_now() -> None:
    here = {**THEN, "device": "cpu (Intel Xeon 8481C)", "threads": {"torch_intra_op_threads": 2}}
    assert machine_differences(THEN, here) == [
        "device: cpu (AMD EPYC 7B13) (profile) vs cpu (Intel Xeon 8481C) (here)",
        "threads: 1 (profile) vs 2 (here)",
    ]


def test_the_warning_is_one_line_once_per_profile(capsys, monkeypatch) -> None:
    monkeypatch.setattr(environment, "_warned", set())
    here = {**THEN, "dtype": "bfloat16"}
    for _ in range(3):
        warn_if_elsewhere("p.json", THEN, here)
    warn_if_elsewhere("q.json", THEN, THEN)  # the same machine: nothing
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: profile p.json was taken elsewhere")
    assert "dtype: float32 (profile) vs bfloat16 (here)" in err
