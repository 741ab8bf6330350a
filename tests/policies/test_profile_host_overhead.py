"""The optional measured host-overhead model in the native profile format."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from policy_factories import FIXTURE_PROFILE

from dsd.common.errors import InputError
from dsd.policies.profile import HostOverhead, HostOverheadLine
from dsd.policies.profile_io import load_profile, profile_to_native, save_profile

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "profile_host_overhead.json"

GOLDEN_MODEL = HostOverhead(
    plain=HostOverheadLine(intercept_ms=0.25, per_row_ms=0.0125),
    spec=HostOverheadLine(intercept_ms=0.375, per_row_ms=0.03125),
    residual_ms=0.0625,
    num_steps=120,
    max_batch_size=4,
)


def _golden_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def test_golden_file_loads_the_model() -> None:
    assert load_profile(GOLDEN).host_overhead == GOLDEN_MODEL


def test_golden_file_is_rewritten_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "again.json"
    save_profile(load_profile(GOLDEN), out)
    assert out.read_text() == GOLDEN.read_text()


def test_model_evaluates_its_line_per_class() -> None:
    # plain: 0.25 + 0.0125 B; spec: 0.375 + 0.03125 B
    assert GOLDEN_MODEL.overhead_ms(8, has_spec=False) == pytest.approx(0.35)
    assert GOLDEN_MODEL.overhead_ms(8, has_spec=True) == pytest.approx(0.625)


def test_profile_without_the_field_loads_as_none_and_writes_no_key(tmp_path: Path) -> None:
    # A bundled file with no such field (PR #32374 format), and a native one without the key.
    profile = load_profile(FIXTURE_PROFILE)
    assert profile.host_overhead is None
    assert "host_overhead" not in profile_to_native(profile)
    data = _golden_data()
    del data["host_overhead"]
    assert load_profile(_write(tmp_path, data)).host_overhead is None


def test_null_field_reads_as_not_measured(tmp_path: Path) -> None:
    data = _golden_data()
    data["host_overhead"] = None
    assert load_profile(_write(tmp_path, data)).host_overhead is None


def test_round_trip_keeps_the_model(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_profile(load_profile(GOLDEN), path)
    assert load_profile(path).host_overhead == GOLDEN_MODEL


BAD_CASES: list[tuple[str, str, Any, str]] = [
    # (where: "" top-level key / "plain" / "spec", key, value, expected message fragment)
    ("", "host_overhead", [1, 2], "host_overhead: expected an object, got a list"),  # not a dict
    ("plain", "intercept_ms", -0.1, "host_overhead.plain.intercept_ms: must be finite and >= 0"),
    ("spec", "per_row_ms", math.nan, "host_overhead.spec.per_row_ms: must be finite and >= 0"),
    ("spec", "per_row_ms", "fast", "host_overhead.spec.per_row_ms: must be a number"),  # text
    ("plain", "per_row_ms", math.inf, "host_overhead.plain.per_row_ms: must be finite"),  # inf
    ("", "residual_ms", -1, "host_overhead.residual_ms: must be finite and >= 0"),  # negative
    ("", "num_steps", 0, "host_overhead.num_steps: must be an integer >= 1, got 0"),  # none
    ("", "num_steps", 2.5, "host_overhead.num_steps: must be an integer >= 1"),  # not integer
    ("", "max_batch_size", True, "host_overhead.max_batch_size: must be an integer >= 1"),  # bool
]


@pytest.mark.parametrize(("where", "key", "value", "fragment"), BAD_CASES)
def test_bad_values_are_one_line_errors_naming_the_field(
    tmp_path: Path, where: str, key: str, value: Any, fragment: str
) -> None:
    data = _golden_data()
    if key == "host_overhead":
        data["host_overhead"] = value
    elif where:
        data["host_overhead"][where][key] = value
    else:
        data["host_overhead"][key] = value
    path = tmp_path / "profile.json"
    # NaN/Infinity literals: the loader accepts them so the field check can name the field.
    path.write_text(json.dumps(data, allow_nan=True))
    with pytest.raises(InputError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert fragment in message


@pytest.mark.parametrize(
    ("section", "missing", "fragment"),
    [
        ("", "spec", "host_overhead: missing field 'spec'"),  # a class's line absent
        ("plain", "per_row_ms", "host_overhead.plain: missing field 'per_row_ms'"),  # slope absent
        ("", "num_steps", "host_overhead: missing field 'num_steps'"),  # count absent
    ],
)
def test_missing_keys_are_named(tmp_path: Path, section: str, missing: str, fragment: str) -> None:
    data = _golden_data()
    holder = data["host_overhead"][section] if section else data["host_overhead"]
    del holder[missing]
    with pytest.raises(InputError, match=fragment.replace(".", r"\.")):
        load_profile(_write(tmp_path, data))


PLANNING = {
    "plain": {"intercept_ms": 0.125, "per_row_ms": 0.0},
    "spec": {"intercept_ms": 0.25, "per_row_ms": 0.0078125},
}


def test_planning_lines_round_trip_and_older_files_have_none(tmp_path: Path) -> None:
    assert GOLDEN_MODEL.planning_plain is None  # the golden file predates the split
    data = _golden_data()
    data["host_overhead"]["planning"] = PLANNING
    model = load_profile(_write(tmp_path, data)).host_overhead
    assert model is not None
    assert model.planning_plain == HostOverheadLine(0.125, 0.0)
    assert model.planning_spec == HostOverheadLine(0.25, 0.0078125)
    again = tmp_path / "again.json"
    save_profile(load_profile(_write(tmp_path, data)), again)
    assert json.loads(again.read_text())["host_overhead"]["planning"] == PLANNING
    # the planning part of a step never exceeds its host overhead
    assert model.planning_ms(8, has_spec=True) == pytest.approx(0.3125)


def test_a_bad_planning_line_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    data = _golden_data()
    data["host_overhead"]["planning"] = {"plain": PLANNING["plain"], "spec": {"per_row_ms": 0}}
    path = _write(tmp_path, data)
    with pytest.raises(InputError, match=r"host_overhead\.planning\.spec: missing field"):
        load_profile(path)


def test_policy_lines_round_trip_and_a_bad_one_is_named(tmp_path: Path) -> None:
    data = _golden_data()
    data["host_overhead"]["policies"] = {
        "per-request": {"intercept_ms": 0.25, "per_row_ms": 0.0},
        "online": {"intercept_ms": 0.125, "per_row_ms": 0.0078125},
    }
    model = load_profile(_write(tmp_path, data)).host_overhead
    assert model is not None
    assert model.policies == (
        ("online", HostOverheadLine(0.125, 0.0078125)),
        ("per-request", HostOverheadLine(0.25, 0.0)),
    )
    again = tmp_path / "again.json"
    save_profile(load_profile(_write(tmp_path, data)), again)
    assert (
        json.loads(again.read_text())["host_overhead"]["policies"]
        == data["host_overhead"]["policies"]
    )
    assert GOLDEN_MODEL.policies == ()  # the golden file predates them
    data["host_overhead"]["policies"]["online"]["per_row_ms"] = -1.0
    with pytest.raises(InputError, match=r"host_overhead\.policies\.online"):
        load_profile(_write(tmp_path, data))
