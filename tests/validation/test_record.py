"""validation.record: every committed report's config.json reads back through the type and
writes out the same JSON; what an older report left out reads as what it meant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsd.common.errors import InputError
from dsd.validation.record import ValidationRecord

RESULTS = Path(__file__).resolve().parents[2] / "results" / "validation"
CONFIGS = sorted(RESULTS.glob("*/config.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.parent.name)
def test_a_committed_record_reads_back_and_writes_the_same_json(path: Path) -> None:
    data = json.loads(path.read_text())
    record = ValidationRecord.from_json(data)
    written = record.to_json()
    assert {key: written[key] for key in data} == data
    # what it adds are the fields an older report left out, at what leaving them out meant
    assert set(written) - set(data) <= {
        "prefill_forward",
        "goodput_acceptance",
        "online_acceptance",
        "per_request_acceptance",
        "trials_done",
        "fast_path",
        "ignore_eos",
        "profile_problems",
        "retime",
    }
    assert record.cell(data["cells"][0]["policy"], data["cells"][0]["max_concurrency"])


def test_an_older_record_means_what_it_left_out() -> None:
    data = json.loads(CONFIGS[-1].read_text())
    for key in ("prefill_forward", "goodput_acceptance", "online_acceptance", "trials_done"):
        data.pop(key, None)
    record = ValidationRecord.from_json(data)
    assert record.prefill_forward == "separate"
    assert record.acceptance_as_run("goodput") == "goodput:acceptance=rates"
    assert record.acceptance_as_run("per-request").startswith("per-request:acceptance=")
    assert record.trials_done == record.trials


def test_with_extra_replaces_a_field_in_place_and_appends_the_rest() -> None:
    record = ValidationRecord.from_json(json.loads(CONFIGS[-1].read_text()))
    updated = record.with_extra(command="dsd hardware-report", added_key=1)
    keys = list(updated.to_json())
    assert updated.command == "dsd hardware-report" and keys[0] == "command"
    assert keys[-1] == "added_key" and keys.index("cells") < keys.index("added_key")


def test_a_folder_that_is_not_a_validation_is_refused_in_one_line() -> None:
    with pytest.raises(InputError, match=r"x/config.json: not a validation record"):
        ValidationRecord.from_json({"command": "dsd simulate"}, "x/config.json")
