"""dsd.common.user_paths and the duplicated-key check of dsd.common.user_files: what a path
that is not a readable file (or a writable place) is called, and JSON keys given twice."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.atomic import atomic_write_text
from dsd.common.errors import InputError
from dsd.common.user_files import parse_user_json
from dsd.common.user_paths import check_input_file, check_output_file, check_output_folder

KEYS = st.text(min_size=1, max_size=6)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(KEYS, VALUES, max_size=5))
def test_json_without_repeated_keys_reads_as_json_does(document: dict[str, object]) -> None:
    text = json.dumps(document)
    assert parse_user_json(text, "doc.json") == json.loads(text)


@given(st.dictionaries(KEYS, VALUES, min_size=1, max_size=5), st.data())
def test_a_key_given_twice_is_refused_naming_it(
    document: dict[str, object], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(document)))
    pairs = [json.dumps(k) + ": " + json.dumps(v) for k, v in document.items()]
    pairs.append(json.dumps(key) + ": 0")  # json would keep this one and drop the first
    nested = '{"outer": {' + ", ".join(pairs) + "}}"
    with pytest.raises(InputError, match="appears twice") as raised:
        parse_user_json(nested, "doc.json")
    assert str(raised.value).startswith(f"doc.json: key {key!r} appears twice")


def test_each_kind_of_non_file_is_named(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    cases = {
        str(tmp_path): "is a directory",
        str(tmp_path / "fifo"): "not a regular file (a FIFO)",
        "/dev/zero": "not a regular file (a character device)",
        "-": "standard input is not read here",
        str(tmp_path / "loop"): "symbolic links",
        str(tmp_path / ("x" * 300)): "file name too long",
        str(tmp_path / "missing"): "no such file",
        "": "an empty path",
    }
    for given_path, words in cases.items():
        with pytest.raises(InputError, match=re.escape(words)):
            check_input_file(given_path)
    regular = tmp_path / "ok.json"
    regular.write_text("{}")
    assert check_input_file(regular).st_size == 2


def test_output_places_that_cannot_be_a_file_or_folder(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for bad, words in {
        "": "an empty path",
        "newdir/": "ends with '/'",
        str(tmp_path): "is a directory",
        "/dev/null": "not a regular file",
        str(tmp_path / ("x" * 300)): "file name too long",
        str(tmp_path / "afile" / "below"): "a part of the path is not a folder",
    }.items():
        with pytest.raises(InputError, match=re.escape(words)):
            check_output_file(bad, "--out")
    assert check_output_file(tmp_path / "new.json") == tmp_path / "new.json"
    for bad, words in {
        "": "--out: an empty path",
        str(tmp_path / "afile"): "exists and is not a folder",
        str(tmp_path / ("x" * 300)): "file name too long",
    }.items():
        with pytest.raises(InputError, match=re.escape(words)):
            check_output_folder(bad)
    assert check_output_folder(tmp_path / "new") == tmp_path / "new"


def test_an_atomic_write_names_the_target_never_its_temp_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        atomic_write_text(tmp_path, "x")
    long_name = tmp_path / ("y" * 250)  # fits; its temp file's name must fit too
    atomic_write_text(long_name, "x")
    assert long_name.read_text() == "x"
    with pytest.raises(OSError) as raised:  # a cache may skip such a store: still an OSError
        atomic_write_text(tmp_path / ("z" * 300), "x")
    assert raised.value.filename == str(tmp_path / ("z" * 300))
    assert sorted(path.name for path in tmp_path.iterdir()) == [long_name.name]
