"""Tests of dsd.common.disk_memo: stored once, read back, recomputed when it cannot be read."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from dsd.common.disk_memo import cache_dir, disk_memo, entry_name, source_fingerprint


def memo(key: object, calls: list[int], value: int = 7) -> int:
    """disk_memo of a counting computation, stored as {"n": value}."""

    def compute() -> int:
        calls.append(value)
        return value

    return disk_memo("test", key, compute, lambda v: {"n": v}, lambda stored: int(stored["n"]))


@pytest.fixture
def folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_computed_once_then_read_back(folder: Path) -> None:
    calls: list[int] = []
    assert memo({"a": 1}, calls) == 7
    assert memo({"a": 1}, calls, value=8) == 7  # read back, not recomputed
    assert calls == [7]
    assert memo({"a": 2}, calls, value=8) == 8  # another key
    assert calls == [7, 8]
    stored = [json.loads(p.read_text()) for p in (folder / "test").glob("*.json")]
    assert sorted(entry["value"]["n"] for entry in stored) == [7, 8]


@pytest.mark.parametrize("content", ["", "{not json", '{"other": 1}', '{"value": {"m": 1}}', "[]"])
def test_an_unreadable_entry_is_recomputed_and_rewritten(folder: Path, content: str) -> None:
    calls: list[int] = []
    memo("k", calls)
    (entry,) = (folder / "test").iterdir()
    entry.write_text(content)
    assert memo("k", calls, value=9) == 9
    assert calls == [7, 9]
    assert json.loads(entry.read_text()) == {"value": {"n": 9}}


def test_an_unwritable_folder_still_returns_the_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DSD_CACHE_DIR", str(blocker))
    calls: list[int] = []
    assert memo("k", calls) == 7 and memo("k", calls) == 7
    assert calls == [7, 7]


@pytest.mark.parametrize("value", ["off", "OFF", ""])
def test_off_turns_the_memo_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("DSD_CACHE_DIR", value)
    assert cache_dir() is None
    calls: list[int] = []
    memo("k", calls)
    memo("k", calls)
    assert calls == [7, 7]


def test_cache_dir_follows_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DSD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "dsd"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "dsd"


def test_source_fingerprint_changes_with_the_source(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    module = types.ModuleType("m")
    module.__file__ = str(source)
    source.write_text("x = 1\n")
    before = source_fingerprint(module)
    assert source_fingerprint(module) == before
    source.write_text("x = 2\n")
    assert source_fingerprint(module) != before
    with pytest.raises(ValueError, match="no source file"):
        source_fingerprint(types.ModuleType("builtin_like"))


@pytest.mark.parametrize("cache", ["folder", "off"])
def test_a_shipped_entry_is_read_where_the_cache_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cache: str
) -> None:
    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache") if cache == "folder" else "off")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / f"{entry_name({'a': 1})}.json").write_text('{"value": {"n": 5}}')
    calls: list[int] = []

    def shipped_memo(key: object, value: int) -> int:
        def compute() -> int:
            calls.append(value)
            return value

        return disk_memo("test", key, compute, lambda v: {"n": v}, lambda s: s["n"], shipped)

    assert shipped_memo({"a": 1}, 7) == 5  # shipped, not computed
    assert shipped_memo({"a": 2}, 8) == 8  # none shipped: computed (and cached if on)
    assert calls == [8]
    if cache == "folder":  # the cache's own entry comes first, and a shipped one is not copied
        (entry,) = (tmp_path / "cache" / "test").iterdir()
        entry.rename(entry.with_name(f"{entry_name({'a': 1})}.json"))
        assert shipped_memo({"a": 1}, 7) == 8
