"""Reading, validating and writing profile files: our native JSON and vLLM PR #32374's file.

`load_profile(path)` detects the format from the content and checks what the table latency
model and the goodput policy need; every problem is an `InputError` of one line naming the file
and the field. `save_profile` writes the native form atomically; `profile_to_pr32374` /
`save_pr32374` write the PR's form, dropping what it has no place for. The two schemas, the
checks and what the PR's form drops: docs/formats.md.

This module does not fit or interpolate anything (see `policies.goodput`, `sim`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from dsd.common import strict_json
from dsd.common.atomic import atomic_write_text
from dsd.common.errors import InputError
from dsd.common.user_files import parse_user_json, read_user_text
from dsd.policies.profile import (
    HostOverhead,
    HostOverheadLine,
    LatencyPoint,
    PrefillInDecodePoint,
    PrefillPoint,
    Profile,
    outcome_matrices,
)

NATIVE_FORMAT = "dsd-profile"
NATIVE_VERSION = 1
# Slack for "non-increasing" on rates written with limited precision.
RATE_TOLERANCE = 1e-9
# Largest integer field or key accepted: counts and sizes must fit numpy's int64 arithmetic.
MAX_INTEGER = 2**62
_ASCII_INTEGER = re.compile(r"-?[0-9]+")


# ---------------------------------------------------------------- field readers


class _Reader:
    """Typed field access that raises one-line InputErrors prefixed with the file name."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field_path: str, message: str) -> InputError:
        where = f"{self.source}: {field_path}: " if field_path else f"{self.source}: "
        return InputError(where + message)

    def obj(self, value: Any, field_path: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field_path, f"expected an object, got {_kind(value)}")
        return value

    def seq(self, value: Any, field_path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(field_path, f"expected a list, got {_kind(value)}")
        return value

    def require(self, mapping: Mapping[str, Any], key: str, field_path: str) -> Any:
        if key not in mapping:
            raise self.fail(field_path, f"missing field {key!r}")
        return mapping[key]

    def integer(self, value: Any, field_path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field_path, f"must be an integer >= {minimum}, got {_short(value)}")
        if value < minimum:
            raise self.fail(field_path, f"must be an integer >= {minimum}, got {value}")
        if value > MAX_INTEGER:
            raise self.fail(field_path, f"must be at most {MAX_INTEGER}, got {_short(value)}")
        return value

    def field_integer(self, entry: Mapping[str, Any], key: str, where: str, minimum: int) -> int:
        """The required integer field `key` of `entry` (at `where`), >= minimum."""
        return self.integer(self.require(entry, key, where), f"{where}.{key}", minimum)

    def field_ms(self, entry: Mapping[str, Any], key: str, where: str, what: str = "ITL") -> float:
        """The required field `key` of `entry` (at `where`): a finite number of ms > 0."""
        return self.positive_ms(self.require(entry, key, where), f"{where}.{key}", what)

    def integer_key(self, key: str, field_path: str, minimum: int) -> int:
        # ASCII digits only: str.isdigit() also accepts '²' and other digits int() refuses.
        text = key.strip()
        if _ASCII_INTEGER.fullmatch(text) is None or int(text) < minimum or int(text) > MAX_INTEGER:
            raise self.fail(field_path, f"key must be an integer >= {minimum}, got {_short(key)}")
        return int(text)

    def number(self, value: Any, field_path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(field_path, f"must be a number, got {_short(value)}")
        try:
            return float(value)
        except OverflowError:  # an integer beyond the float range (JSON allows any digits)
            raise self.fail(field_path, f"number too large, got {_short(value)}") from None

    def positive_ms(self, value: Any, field_path: str, what: str = "ITL") -> float:
        number = self.number(value, field_path)
        if not math.isfinite(number) or number <= 0:
            raise self.fail(field_path, f"{what} must be finite and > 0, got {_short(value)}")
        return number

    def nonnegative_ms(self, entry: Mapping[str, Any], key: str, where: str) -> float:
        """The required field `key` of `entry` (at `where`): a finite number of ms >= 0."""
        path = f"{where}.{key}"
        value = self.require(entry, key, where)
        number = self.number(value, path)
        if not math.isfinite(number) or number < 0:
            raise self.fail(path, f"must be finite and >= 0 ms, got {_short(value)}")
        return number

    def rate(self, value: Any, field_path: str) -> float:
        number = self.number(value, field_path)
        if not (math.isfinite(number) and 0.0 <= number <= 1.0):
            raise self.fail(field_path, f"acceptance rate must be in [0, 1], got {_short(value)}")
        return number

    def rates(self, values: Any, field_path: str) -> tuple[float, ...]:
        """Unconditional per-position rates: each in [0, 1], non-increasing."""
        items = self.seq(values, field_path)
        rates = tuple(self.rate(v, f"{field_path}[{i}]") for i, v in enumerate(items))
        for i in range(1, len(rates)):
            if rates[i] > rates[i - 1] + RATE_TOLERANCE:
                raise self.fail(
                    f"{field_path}[{i}]",
                    f"rates are unconditional and must be non-increasing, got {rates[i]!r} "
                    f"after {rates[i - 1]!r}",
                )
        return rates


def _short(value: Any) -> str:
    """repr of a value, cut to one readable line (a hostile file may hold huge values)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    return repr(value)


def _check_table_coverage(
    reader: _Reader, points: tuple[LatencyPoint, ...], k_max: int, field_path: str
) -> None:
    """What the table model needs: B = 1 profiled, and K = 0, 1, K_max at every profiled B."""
    if not points:
        raise reader.fail(field_path, "no latency points")
    ks_by_batch: dict[int, set[int]] = {}
    for point in points:
        if point.num_spec_tokens > k_max:
            raise reader.fail(
                field_path,
                f"B={point.batch_size} has K={point.num_spec_tokens} > k_max {k_max}",
            )
        ks_by_batch.setdefault(point.batch_size, set()).add(point.num_spec_tokens)
    if 1 not in ks_by_batch:
        raise reader.fail(field_path, f"batch size 1 must be profiled, got B={sorted(ks_by_batch)}")
    required = sorted({0, min(1, k_max), k_max})
    for batch_size in sorted(ks_by_batch):
        missing = [k for k in required if k not in ks_by_batch[batch_size]]
        if missing:
            raise reader.fail(
                field_path,
                f"B={batch_size} is missing K={missing} (K=0, 1 and k_max={k_max} are required "
                "at every profiled B)",
            )


# ---------------------------------------------------------------- PR #32374 format


def _parse_pr32374(reader: _Reader, data: Mapping[str, Any]) -> Profile:
    k_max = reader.integer(
        reader.require(data, "max_num_speculative_tokens", ""), "max_num_speculative_tokens", 1
    )
    rates = reader.rates(
        reader.require(data, "acceptance_rate_per_pos", ""), "acceptance_rate_per_pos"
    )
    if len(rates) != k_max:
        raise reader.fail(
            "acceptance_rate_per_pos",
            f"needs max_num_speculative_tokens={k_max} rates, got {len(rates)}",
        )
    is_online = data.get("is_online", False)
    if not isinstance(is_online, bool):
        raise reader.fail("is_online", f"must be true or false, got {_short(is_online)}")
    batch_stats = reader.obj(reader.require(data, "batch_stats", ""), "batch_stats")
    points: list[LatencyPoint] = []
    for b_key, row in batch_stats.items():
        row_path = f"batch_stats[{_short(b_key)}]"
        batch_size = reader.integer_key(b_key, row_path, 1)
        for k_key, itl in reader.obj(row, row_path).items():
            cell_path = f"{row_path}[{_short(k_key)}]"
            num_spec_tokens = reader.integer_key(k_key, cell_path, 0)
            points.append(
                LatencyPoint(
                    batch_size=batch_size,
                    num_spec_tokens=num_spec_tokens,
                    median_ms=reader.positive_ms(itl, cell_path),
                )
            )
    latency = tuple(sorted(points, key=lambda p: (p.batch_size, p.num_spec_tokens)))
    _check_table_coverage(reader, latency, k_max, "batch_stats")
    metadata: dict[str, Any] = {"source_format": "pr32374", "is_online": is_online}
    if isinstance(data.get("_note"), str):
        metadata["note"] = data["_note"]
    return Profile(k_max=k_max, latency=latency, acceptance_rates=rates, metadata=metadata)


def profile_to_pr32374(profile: Profile) -> dict[str, Any]:
    """The PR #32374 `dynamic_speculative_config.json` object for `profile`.

    ITL points at several context lengths for one (B, K) are averaged (as `itl_grid` does);
    prefill points, counts and per-request samples have no place in that format.
    """
    batch_sizes, ks, grid = profile.itl_grid()
    batch_stats: dict[str, dict[str, float]] = {}
    for i, batch_size in enumerate(batch_sizes):
        row = {
            str(int(k)): float(grid[i, j])
            for j, k in enumerate(ks)
            if math.isfinite(float(grid[i, j]))
        }
        batch_stats[str(int(batch_size))] = row
    return {
        "is_online": bool(profile.metadata.get("is_online", False)),
        "batch_stats": batch_stats,
        "max_num_speculative_tokens": profile.k_max,
        "acceptance_rate_per_pos": [float(r) for r in profile.acceptance_rates],
    }


def save_pr32374(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write `profile_to_pr32374(profile)` atomically."""
    atomic_write_text(path, strict_json.dumps(profile_to_pr32374(profile), indent=4) + "\n")


# ---------------------------------------------------------------- native format


def _optional(
    reader: _Reader, entry: Mapping[str, Any], key: str, field_path: str, kind: str
) -> Any:
    value = entry.get(key)
    if value is None:
        return None
    if kind == "ms":
        return reader.positive_ms(value, f"{field_path}.{key}", "latency")
    return reader.integer(value, f"{field_path}.{key}", 0 if kind == "int0" else 1)


def _parse_native(reader: _Reader, data: Mapping[str, Any]) -> Profile:
    version = data.get("version")
    if version != NATIVE_VERSION:
        raise reader.fail(
            "version", f"unsupported version {_short(version)}, expected {NATIVE_VERSION}"
        )
    k_max = reader.integer(reader.require(data, "k_max", ""), "k_max", 1)
    temperature = reader.number(data.get("temperature", 0.0), "temperature")
    if not math.isfinite(temperature) or temperature < 0:
        raise reader.fail("temperature", f"must be finite and >= 0, got {temperature!r}")
    metadata = dict(reader.obj(data.get("metadata", {}), "metadata"))
    if "forward_tokens" in metadata:  # priced by the parametric latency model: checked here
        path = "metadata.forward_tokens"
        metadata["forward_tokens"] = [
            reader.integer(value, f"{path}[{index}]", index + 1)  # n tokens compute >= n
            for index, value in enumerate(reader.seq(metadata["forward_tokens"], path))
        ]

    points: list[LatencyPoint] = []
    for index, raw in enumerate(reader.seq(reader.require(data, "latency", ""), "latency")):
        path = f"latency[{index}]"
        entry = reader.obj(raw, path)
        points.append(
            LatencyPoint(
                batch_size=reader.field_integer(entry, "batch_size", path, 1),
                num_spec_tokens=reader.field_integer(entry, "num_spec_tokens", path, 0),
                median_ms=reader.field_ms(entry, "median_ms", path),
                context_len=_optional(reader, entry, "context_len", path, "int0"),
                p10_ms=_optional(reader, entry, "p10_ms", path, "ms"),
                p90_ms=_optional(reader, entry, "p90_ms", path, "ms"),
                n=_optional(reader, entry, "n", path, "int1"),
                mean_ms=_optional(reader, entry, "mean_ms", path, "ms"),
            )
        )
    latency = tuple(points)
    _check_table_coverage(reader, latency, k_max, "latency")

    prefill: list[PrefillPoint] = []
    for index, raw in enumerate(reader.seq(data.get("prefill", []), "prefill")):
        path = f"prefill[{index}]"
        entry = reader.obj(raw, path)
        prefill.append(
            PrefillPoint(
                num_tokens=reader.field_integer(entry, "num_tokens", path, 1),
                median_ms=reader.field_ms(entry, "median_ms", path, "latency"),
                batch_size=reader.integer(entry.get("batch_size", 1), f"{path}.batch_size", 1),
                n=_optional(reader, entry, "n", path, "int1"),
                mean_ms=_optional(reader, entry, "mean_ms", path, "ms"),
            )
        )

    in_decode: list[PrefillInDecodePoint] = []
    for index, raw in enumerate(reader.seq(data.get("prefill_in_decode", []), "prefill_in_decode")):
        path = f"prefill_in_decode[{index}]"
        entry = reader.obj(raw, path)
        in_decode.append(
            PrefillInDecodePoint(
                num_tokens=reader.field_integer(entry, "num_tokens", path, 1),
                decode_rows=reader.field_integer(entry, "decode_rows", path, 1),
                added_ms=reader.nonnegative_ms(entry, "added_ms", path),
                n=_optional(reader, entry, "n", path, "int1"),
            )
        )

    acceptance = reader.obj(reader.require(data, "acceptance", ""), "acceptance")
    drafted: tuple[int, ...] | None = None
    accepted: tuple[int, ...] | None = None
    num_steps: int | None = None
    draft_rates: tuple[float, ...] | None = None
    if "rates" in acceptance:
        rates = reader.rates(acceptance["rates"], "acceptance.rates")
        if acceptance.get("draft_rates") is not None:
            draft_rates = _parse_draft_rates(reader, acceptance["draft_rates"], rates)
    elif "drafted_at_pos" in acceptance or "accepted_at_pos" in acceptance:
        drafted, accepted, num_steps, rates, draft_rates = _parse_counts(reader, acceptance)
    else:
        raise reader.fail(
            "acceptance", "needs 'rates' or both 'drafted_at_pos' and 'accepted_at_pos'"
        )
    if len(rates) != k_max:
        raise reader.fail("acceptance", f"needs k_max={k_max} positions, got {len(rates)}")
    draft_outcomes = _parse_draft_outcomes(
        reader, data.get("draft_outcomes", []), k_max, num_steps, drafted, accepted
    )
    keys = reader.seq(data.get("draft_outcome_keys", []), "draft_outcome_keys")
    if keys and len(keys) != len(draft_outcomes):
        raise reader.fail(
            "draft_outcome_keys", f"has {len(keys)} keys for {len(draft_outcomes)} draft_outcomes"
        )
    for index, key in enumerate(keys):
        if not isinstance(key, str):
            raise reader.fail(f"draft_outcome_keys[{index}]", "must be a string")
    sequences = _parse_draft_sequences(
        reader, data.get("draft_sequences", []), k_max, len(draft_outcomes)
    )

    per_request: list[tuple[float, ...]] = []
    for index, raw in enumerate(reader.seq(data.get("per_request_rates", []), "per_request_rates")):
        path = f"per_request_rates[{index}]"
        sample = reader.rates(raw, path)
        if len(sample) > k_max:
            raise reader.fail(path, f"has {len(sample)} positions, more than k_max={k_max}")
        per_request.append(sample)

    raw_overhead = data.get("host_overhead")
    host_overhead = None if raw_overhead is None else _parse_host_overhead(reader, raw_overhead)

    return Profile(
        k_max=k_max,
        latency=latency,
        acceptance_rates=rates,
        drafted_at_pos=drafted,
        accepted_at_pos=accepted,
        prefill=tuple(prefill),
        prefill_in_decode=tuple(in_decode),
        per_request_rates=tuple(per_request),
        temperature=temperature,
        host_overhead=host_overhead,
        draft_rates=draft_rates,
        num_acceptance_steps=num_steps,
        draft_outcomes=draft_outcomes,
        draft_outcome_keys=tuple(keys),
        draft_sequences=sequences,
        metadata=metadata,
    )


def _parse_draft_sequences(
    reader: _Reader, values: Any, k_max: int, num_outcomes: int
) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """`draft_sequences`: one {"available": [...], "matched": [...]} per draft_outcomes row,
    equal non-empty lists with 0 <= matched <= available <= k_max."""
    entries = reader.seq(values, "draft_sequences")
    if entries and len(entries) != num_outcomes:
        raise reader.fail(
            "draft_sequences", f"has {len(entries)} sequences for {num_outcomes} draft_outcomes"
        )
    sequences = []
    for index, raw in enumerate(entries):
        path = f"draft_sequences[{index}]"
        entry = reader.obj(raw, path)
        lists = []
        for key in ("available", "matched"):
            items = reader.seq(reader.require(entry, key, path), f"{path}.{key}")
            lists.append(
                tuple(reader.integer(v, f"{path}.{key}[{i}]", 0) for i, v in enumerate(items))
            )
        available, matched = lists
        if not available or len(available) != len(matched):
            raise reader.fail(path, "available and matched must be equal non-empty lists")
        for position, (a, m) in enumerate(zip(available, matched, strict=True)):
            if not m <= a <= k_max:
                raise reader.fail(
                    f"{path}[{position}]",
                    f"needs matched <= available <= k_max={k_max}, got {m} and {a}",
                )
        sequences.append((available, matched))
    return tuple(sequences)


def _parse_draft_rates(reader: _Reader, values: Any, rates: tuple[float, ...]) -> tuple[float, ...]:
    """s_i of the rates form: like rates (in [0, 1], non-increasing), one per rate, >= r_i."""
    draft_rates = reader.rates(values, "acceptance.draft_rates")
    if len(draft_rates) != len(rates):
        raise reader.fail(
            "acceptance.draft_rates", f"needs {len(rates)} positions, got {len(draft_rates)}"
        )
    for i, (rate, draft_rate) in enumerate(zip(rates, draft_rates, strict=True)):
        if rate > draft_rate + RATE_TOLERANCE:
            raise reader.fail(
                f"acceptance.draft_rates[{i}]",
                f"a step accepts at most what it drafted: rate {rate!r} > draft rate "
                f"{draft_rate!r}",
            )
    return draft_rates


def _parse_draft_outcomes(
    reader: _Reader,
    raw: Any,
    k_max: int,
    num_steps: int | None,
    drafted: tuple[int, ...] | None,
    accepted: tuple[int, ...] | None,
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per-request (d, a) histograms at k_max; their sum must give the acceptance counts."""
    items = reader.seq(raw, "draft_outcomes")
    if not items:
        return ()
    if num_steps is None or drafted is None or accepted is None:
        raise reader.fail(
            "draft_outcomes", "needs the acceptance counts with 'num_steps' they sum to"
        )
    outcomes: list[tuple[tuple[int, ...], ...]] = []
    for index, item in enumerate(items):
        path = f"draft_outcomes[{index}]"
        rows = reader.seq(item, path)
        if len(rows) != k_max + 1:
            raise reader.fail(path, f"needs k_max + 1 = {k_max + 1} rows (d = 0..k_max)")
        parsed: list[tuple[int, ...]] = []
        for num_drafted, row in enumerate(rows):
            row_path = f"{path}[{num_drafted}]"
            counts = reader.seq(row, row_path)
            if len(counts) != num_drafted + 1:
                raise reader.fail(
                    row_path, f"needs {num_drafted + 1} counts (a = 0..{num_drafted})"
                )
            parsed.append(
                tuple(reader.integer(v, f"{row_path}[{a}]", 0) for a, v in enumerate(counts))
            )
        if sum(sum(row) for row in parsed) == 0:
            raise reader.fail(path, "a request without steps gives no sample")
        outcomes.append(tuple(parsed))
    joint = outcome_matrices(tuple(outcomes), k_max).sum(axis=0)  # [k+1, k+1] (d, a)
    positions = range(1, k_max + 1)
    derived = (
        int(joint.sum()),
        tuple(int(joint[i:].sum()) for i in positions),
        tuple(int(joint[:, i:].sum()) for i in positions),
    )
    if derived != (num_steps, drafted, accepted):
        raise reader.fail(
            "draft_outcomes",
            f"sum to num_steps {derived[0]}, drafted {list(derived[1])}, accepted "
            f"{list(derived[2])}; the acceptance counts say {num_steps}, {list(drafted)}, "
            f"{list(accepted)}",
        )
    return tuple(outcomes)


def _parse_host_overhead(reader: _Reader, raw: Any) -> HostOverhead:
    """The optional measured host-overhead model (see docs/formats.md)."""
    entry = reader.obj(raw, "host_overhead")
    lines = _host_overhead_lines(reader, entry, "host_overhead")
    planning = None
    if entry.get("planning") is not None:
        path = "host_overhead.planning"
        planning = _host_overhead_lines(reader, reader.obj(entry["planning"], path), path)
    policies: list[tuple[str, HostOverheadLine]] = []
    if entry.get("policies") is not None:
        path = "host_overhead.policies"
        for name, raw_line in sorted(reader.obj(entry["policies"], path).items()):
            policies.append((str(name), _host_overhead_line(reader, raw_line, f"{path}.{name}")))
    return HostOverhead(
        plain=lines["plain"],
        spec=lines["spec"],
        planning_plain=None if planning is None else planning["plain"],
        planning_spec=None if planning is None else planning["spec"],
        policies=tuple(policies),
        residual_ms=reader.nonnegative_ms(entry, "residual_ms", "host_overhead"),
        num_steps=reader.integer(
            reader.require(entry, "num_steps", "host_overhead"), "host_overhead.num_steps", 1
        ),
        max_batch_size=reader.integer(
            reader.require(entry, "max_batch_size", "host_overhead"),
            "host_overhead.max_batch_size",
            1,
        ),
    )


def _host_overhead_lines(
    reader: _Reader, entry: Mapping[str, Any], where: str
) -> dict[str, HostOverheadLine]:
    """The "plain" and "spec" lines of a host-overhead object (or of its "planning" part)."""
    return {
        kind: _host_overhead_line(reader, reader.require(entry, kind, where), f"{where}.{kind}")
        for kind in ("plain", "spec")
    }


def _host_overhead_line(reader: _Reader, raw: Any, path: str) -> HostOverheadLine:
    line = reader.obj(raw, path)
    return HostOverheadLine(
        intercept_ms=reader.nonnegative_ms(line, "intercept_ms", path),
        per_row_ms=reader.nonnegative_ms(line, "per_row_ms", path),
    )


def _line_to_native(line: HostOverheadLine) -> dict[str, float]:
    return {"intercept_ms": line.intercept_ms, "per_row_ms": line.per_row_ms}


def host_overhead_to_native(model: HostOverhead) -> dict[str, Any]:
    """The native JSON object of a host-overhead model (inverse of reading it)."""
    native: dict[str, Any] = {
        "plain": _line_to_native(model.plain),
        "spec": _line_to_native(model.spec),
        "residual_ms": model.residual_ms,
        "num_steps": model.num_steps,
        "max_batch_size": model.max_batch_size,
    }
    if model.planning_plain is not None and model.planning_spec is not None:
        native["planning"] = {
            "plain": _line_to_native(model.planning_plain),
            "spec": _line_to_native(model.planning_spec),
        }
    if model.policies:
        native["policies"] = {name: _line_to_native(line) for name, line in model.policies}
    return native


def _parse_counts(
    reader: _Reader, acceptance: Mapping[str, Any]
) -> tuple[
    tuple[int, ...], tuple[int, ...], int | None, tuple[float, ...], tuple[float, ...] | None
]:
    """(drafted, accepted, num_steps, r, s) of the counts form.

    With `num_steps` (steps at k_max, those that drafted nothing included): r_i = accepted /
    num_steps, s_i = drafted / num_steps. Without it (older profiles, every step drafted
    k_max): r_i = accepted / drafted and s = None.
    """
    num_steps: int | None = None
    if acceptance.get("num_steps") is not None:
        num_steps = reader.integer(acceptance["num_steps"], "acceptance.num_steps", 1)
    raw_drafted = reader.seq(
        reader.require(acceptance, "drafted_at_pos", "acceptance"), "acceptance.drafted_at_pos"
    )
    raw_accepted = reader.seq(
        reader.require(acceptance, "accepted_at_pos", "acceptance"), "acceptance.accepted_at_pos"
    )
    if len(raw_drafted) != len(raw_accepted):
        raise reader.fail(
            "acceptance",
            f"drafted_at_pos has {len(raw_drafted)} positions, accepted_at_pos {len(raw_accepted)}",
        )
    # With num_steps a position may never be drafted (a lookup that finds little); without
    # it every step drafted every position, so a zero count would be a 0/0 rate.
    min_drafted = 0 if num_steps is not None else 1
    drafted = tuple(
        reader.integer(v, f"acceptance.drafted_at_pos[{i}]", min_drafted)
        for i, v in enumerate(raw_drafted)
    )
    accepted = tuple(
        reader.integer(v, f"acceptance.accepted_at_pos[{i}]", 0) for i, v in enumerate(raw_accepted)
    )
    for i, (num_drafted, num_accepted) in enumerate(zip(drafted, accepted, strict=True)):
        if num_accepted > num_drafted:
            raise reader.fail(
                f"acceptance.accepted_at_pos[{i}]",
                f"accepted {num_accepted} > drafted {num_drafted} at position {i + 1}",
            )
        if i > 0 and num_drafted > drafted[i - 1]:
            raise reader.fail(
                f"acceptance.drafted_at_pos[{i}]",
                f"must be non-increasing (a request drafting i+1 tokens drafted i), "
                f"got {num_drafted} after {drafted[i - 1]}",
            )
        if i > 0 and num_accepted > accepted[i - 1]:
            raise reader.fail(
                f"acceptance.accepted_at_pos[{i}]",
                f"must be non-increasing, got {num_accepted} after {accepted[i - 1]}",
            )
    if num_steps is None:
        per_drafted = [a / d for a, d in zip(accepted, drafted, strict=True)]
        # Re-check through the same rule as given rates: unconditional rates must not rise.
        reader.rates(per_drafted, "acceptance (accepted_at_pos / drafted_at_pos)")
        return drafted, accepted, None, tuple(per_drafted), None
    if drafted and drafted[0] > num_steps:
        raise reader.fail(
            "acceptance.drafted_at_pos[0]",
            f"{drafted[0]} steps drafted, more than num_steps {num_steps}",
        )
    # Counts are non-increasing (checked above), so these rates are too.
    rates = tuple(a / num_steps for a in accepted)
    draft_rates = tuple(d / num_steps for d in drafted)
    return drafted, accepted, num_steps, rates, draft_rates


def profile_to_native(profile: Profile) -> dict[str, Any]:
    """The native JSON object for `profile` (inverse of loading it)."""
    acceptance: dict[str, Any]
    has_counts = profile.drafted_at_pos is not None and profile.accepted_at_pos is not None
    if has_counts and (profile.num_acceptance_steps is not None or profile.draft_rates is None):
        acceptance = {
            "drafted_at_pos": list(profile.drafted_at_pos or ()),
            "accepted_at_pos": list(profile.accepted_at_pos or ()),
        }
        # Written only when known, so an older profile stays byte-identical.
        if profile.num_acceptance_steps is not None:
            acceptance["num_steps"] = profile.num_acceptance_steps
    else:
        acceptance = {"rates": list(profile.acceptance_rates)}
        if profile.draft_rates is not None:
            acceptance["draft_rates"] = list(profile.draft_rates)
    latency = []
    for point in profile.latency:
        entry: dict[str, Any] = {
            "batch_size": point.batch_size,
            "num_spec_tokens": point.num_spec_tokens,
            "median_ms": point.median_ms,
        }
        for key in ("context_len", "p10_ms", "p90_ms", "n", "mean_ms"):
            value = getattr(point, key)
            if value is not None:
                entry[key] = value
        latency.append(entry)
    prefill = []
    for prefill_point in profile.prefill:
        prefill_entry: dict[str, Any] = {
            "num_tokens": prefill_point.num_tokens,
            "batch_size": prefill_point.batch_size,
            "median_ms": prefill_point.median_ms,
        }
        for key in ("n", "mean_ms"):
            value = getattr(prefill_point, key)
            if value is not None:
                prefill_entry[key] = value
        prefill.append(prefill_entry)
    native: dict[str, Any] = {
        "format": NATIVE_FORMAT,
        "version": NATIVE_VERSION,
        "metadata": dict(profile.metadata),
        "k_max": profile.k_max,
        "temperature": profile.temperature,
        "latency": latency,
        "prefill": prefill,
        "acceptance": acceptance,
        "per_request_rates": [list(sample) for sample in profile.per_request_rates],
    }
    # Written only when measured, so a profile without them stays byte-identical to before.
    if profile.prefill_in_decode:
        native["prefill_in_decode"] = [
            {
                "num_tokens": point.num_tokens,
                "decode_rows": point.decode_rows,
                "added_ms": point.added_ms,
                **({} if point.n is None else {"n": point.n}),
            }
            for point in profile.prefill_in_decode
        ]
    if profile.host_overhead is not None:
        native["host_overhead"] = host_overhead_to_native(profile.host_overhead)
    if profile.draft_outcomes:
        native["draft_outcomes"] = [[list(row) for row in rows] for rows in profile.draft_outcomes]
    if profile.draft_outcome_keys:
        native["draft_outcome_keys"] = list(profile.draft_outcome_keys)
    if profile.draft_sequences:
        native["draft_sequences"] = [
            {"available": list(available), "matched": list(matched)}
            for available, matched in profile.draft_sequences
        ]
    return native


def profile_json_text(profile: Profile) -> str:
    """The native JSON text of `profile`, as `save_profile` writes it."""
    return strict_json.dumps(profile_to_native(profile), indent=2) + "\n"


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write the native JSON form of `profile` atomically."""
    atomic_write_text(path, profile_json_text(profile))


# ---------------------------------------------------------------- entry points


def parse_profile(data: Any, source: str) -> Profile:
    """A Profile from already-decoded JSON (`source` names it in error messages)."""
    reader = _Reader(source)
    if not isinstance(data, dict):
        raise reader.fail("", f"expected a JSON object at the top level, got {_kind(data)}")
    if data.get("format") == NATIVE_FORMAT:
        return _parse_native(reader, data)
    if "format" in data:
        raise reader.fail("format", f"unknown profile format {_short(data['format'])}")
    if "batch_stats" in data:
        return _parse_pr32374(reader, data)
    raise reader.fail(
        "",
        f"unknown profile format: expected {{'format': '{NATIVE_FORMAT}', ...}} or a vLLM "
        "PR #32374 dynamic_speculative_config.json with 'batch_stats'",
    )


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a native or PR #32374 profile file; one-line InputError on any problem."""
    source = str(path)
    # NaN/Infinity literals pass the decoder so the field check names the field they are in.
    data = parse_user_json(read_user_text(path, source), source, allow_nonfinite=True)
    return parse_profile(data, source)
