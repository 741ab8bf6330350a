"""A sweep grid from a TOML file (`dsd sweep --grid grid.toml`), expanded into sweep cells.

`load_grid` reads the file into a `SweepGrid`, checking every key with the key named in the
error (types and ranges, nested tables against their dataclass fields, unknown keys, empty or
duplicated axes, at most MAX_GRID_CELLS cells, prompt counts, dataset names and workload files,
policy names) and taking relative paths from the grid file's folder. `expand_grid` turns it into
cells in a fixed axis order, each seeded by its load point (`reports.sweep.load_seed`), so every
policy at one point shares its random numbers. The file's keys, the expansion order and the
seeds: docs/sweeps.md.

What this module does not do: run cells, write files, or check a policy SPEC's arguments
against a profile (the sweep resolves every cell before running, which does).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsd.common.errors import InputError
from dsd.common.user_files import read_user_text
from dsd.policies.plugin import load_factory, split_user_spec
from dsd.policies.spec import POLICY_BUILDERS
from dsd.reports.sweep import SweepCell, load_seed
from dsd.sim.config import RunConfig
from dsd.traces.datasets import RandomLengths
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import KNOWN_NAMES, MAX_COUNT
from dsd.traces.rollout import RolloutConfig

DEFAULT_DATASET = "mt-bench"
DEFAULT_PROMPTS_PER_CONCURRENCY = 20
# Most cells a grid may expand to: far past any sweep anyone runs, far below what would take
# minutes (and gigabytes) just to expand and check before the first cell runs.
MAX_GRID_CELLS = 100_000

TOP_KEYS: tuple[str, ...] = (
    "profile",
    "policies",
    "seeds",
    "scheduling",
    "max_concurrency",
    "request_rate",
    "num_prompts_per_concurrency",
    "num_prompts",
    "workloads",
    "config",
)
# Workload-table keys that are RunConfig fields of the workload itself.
WORKLOAD_FIELDS: tuple[str, ...] = (
    "burstiness",
    "output_len",
    "chat_template",
    "shuffle",
    "random_lengths",
    "trace_options",
    "rollout",
)
WORKLOAD_KEYS: tuple[str, ...] = (
    "name",
    "dataset",
    "max_concurrency",
    "request_rate",
    "num_prompts_per_concurrency",
    "num_prompts",
    *WORKLOAD_FIELDS,
)
# RunConfig fields the grid sets through its own keys, so `[config]` may not.
_OWNED_FIELDS = frozenset(
    {
        "profile",
        "policy",
        "dataset",
        "num_prompts",
        "max_concurrency",
        "request_rate",
        "scheduling",
        "seed",
        *WORKLOAD_FIELDS,
    }
)
CONFIG_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(RunConfig) if f.name not in _OWNED_FIELDS
)
_NESTED: dict[str, type] = {
    "random_lengths": RandomLengths,
    "trace_options": TraceOptions,
    "rollout": RolloutConfig,
}


@dataclass(frozen=True)
class GridWorkload:
    """One `[[workloads]]` entry, checked."""

    name: str  # label in tables and plots
    dataset: str  # registry name or an absolute workload-file path
    max_concurrency: tuple[int | None, ...]  # closed-loop caps; (None,) = no cap
    request_rate: tuple[float, ...]  # arrival rates, req/s (inf = all at t=0)
    num_prompts_per_concurrency: int | None  # N = this x C when C is set and num_prompts is None
    num_prompts: int | None  # a fixed N (wins over the per-concurrency count)
    fields: tuple[tuple[str, Any], ...]  # other RunConfig fields of this workload


@dataclass(frozen=True)
class SweepGrid:
    """A checked grid file: what `expand_grid` turns into cells."""

    source: str  # the grid file path, for messages
    profiles: tuple[str, ...]  # absolute profile paths
    policies: tuple[str, ...]  # policy SPECs
    seeds: tuple[int, ...]  # sweep seeds
    scheduling: tuple[str, ...]  # "sync" / "async"
    workloads: tuple[GridWorkload, ...]  # at least one
    fixed: tuple[tuple[str, Any], ...]  # [config] scalars (field, value)
    swept: tuple[tuple[str, tuple[Any, ...]], ...]  # [config] lists (field, values), as written


def _type_name(value: Any) -> str:
    return type(value).__name__


def _as_list(source: str, key: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise InputError(f"{source}: {key}: empty list (give at least one value)")
    return values


def _unique(source: str, key: str, values: Sequence[Any]) -> None:
    seen: list[Any] = []
    for value in values:
        if value in seen:
            raise InputError(f"{source}: {key}: duplicate value {value!r}")
        seen.append(value)


def _strings(source: str, key: str, value: Any) -> list[str]:
    values = _as_list(source, key, value)
    for item in values:
        if not isinstance(item, str) or not item.strip():
            raise InputError(f"{source}: {key}: expected non-empty strings, got {item!r}")
    _unique(source, key, values)
    return values


def _ints(source: str, key: str, value: Any, minimum: int, maximum_power: int = 53) -> list[int]:
    """Distinct integers in [minimum, 2**maximum_power] (counts: 2**53; seeds: 2**64 - 1)."""
    maximum = 2**maximum_power - (1 if maximum_power == 64 else 0)
    values = _as_list(source, key, value)
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int) or not minimum <= item <= maximum:
            bound = "below 2**64" if maximum_power == 64 else f"at most 2**{maximum_power}"
            raise InputError(
                f"{source}: {key}: expected integers >= {minimum} ({bound}), got {item!r}"
            )
    _unique(source, key, values)
    return values


def _rates(source: str, key: str, value: Any) -> list[float]:
    rates: list[float] = []
    for item in _as_list(source, key, value):
        if item == "inf":
            rates.append(math.inf)
        elif isinstance(item, int | float) and not isinstance(item, bool) and item > 0:
            if math.isnan(item):
                raise InputError(f'{source}: {key}: expected numbers > 0 or "inf", got nan')
            rates.append(float(item))
        else:
            raise InputError(f'{source}: {key}: expected numbers > 0 or "inf", got {item!r}')
    _unique(source, key, rates)
    return rates


def _one_int(source: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise InputError(
            f"{source}: {key}: expected an integer >= 1 (at most 2**53), got {value!r}"
        )
    return value


def _accepts(hint: Any, value: Any) -> bool:
    """Whether `value` (from TOML) has a type the dataclass field hint allows."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_accepts(arg, value) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True  # a type this checker does not know: the dataclass's own checks decide


def _check_fields(source: str, where: str, fields: dict[str, Any]) -> None:
    """Each workload or [config] value alone through RunConfig's checks (key named)."""
    for key, value in fields.items():
        try:
            RunConfig(profile="-", policy="-", **{key: value})
        except InputError as exc:
            raise InputError(f"{source}: {where}{exc}") from None
        except TypeError as exc:
            raise InputError(f"{source}: {where}{key}: {exc}") from None


def _category_acceptance(source: str, value: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """`[config.category_acceptance]`, `tag = [r_1, ...]` per category: fixed (not an axis)."""
    if not isinstance(value, dict):
        raise InputError(
            f"{source}: config.category_acceptance: expected a table of tag = [rates] (one set "
            f"for every cell, not an axis), got {_type_name(value)}"
        )
    pairs = tuple(
        (tag, tuple(rates) if isinstance(rates, list) else rates) for tag, rates in value.items()
    )
    _check_fields(source, "config.", {"category_acceptance": pairs})
    return pairs


def _unknown_keys(source: str, where: str, table: dict[str, Any], known: Sequence[str]) -> None:
    for key in table:
        if key not in known:
            raise InputError(f"{source}: {where}{key}: unknown key (known: {', '.join(known)})")


def _hint_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(repr(arg) for arg in typing.get_args(hint))
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]  # TOML has no null
    if args:
        return " or ".join(_hint_name(arg) for arg in args)
    return "nothing" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _path(base: Path, text: str) -> str:
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _user_policy(source: str, base: Path, spec: str) -> str:
    """A built-in SPEC as it is; a user's policy (FILE.py:Class, module:Class, an entry point)
    checked to load, its file relative to the grid file's folder."""
    if spec.strip().partition(":")[0].strip().lower() in POLICY_BUILDERS:
        return spec
    parts = split_user_spec(spec)
    if parts.kind == "file":
        spec = _path(base, parts.location) + spec.strip()[len(parts.location) :]
    try:
        load_factory(spec)
    except InputError as error:
        raise InputError(f"{source}: policies: {error}") from None
    return spec


def _nested(source: str, key: str, value: Any) -> Any:
    """A TOML table -> RandomLengths / TraceOptions / RolloutConfig (their checks apply)."""
    kind = _NESTED[key.rsplit(".", 1)[-1]]
    if not isinstance(value, dict):
        raise InputError(f"{source}: {key}: expected a table, got {_type_name(value)}")
    names = [f.name for f in dataclasses.fields(kind)]
    _unknown_keys(source, f"{key}.", value, names)
    values = dict(value)
    hints = typing.get_type_hints(kind)
    for name, item in values.items():
        if item == "inf":
            values[name] = item = math.inf
        if not _accepts(hints[name], item):
            raise InputError(
                f"{source}: {key}.{name}: expected {_hint_name(hints[name])}, got {item!r}"
            )
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_COUNT:
            # token counts and row counts; past 2**53 float arithmetic on them overflows
            raise InputError(f"{source}: {key}.{name}: at most 2**53, got {item!r}")
    try:
        return kind(**values)
    except InputError as exc:
        raise InputError(f"{source}: {key}.{exc}") from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"{source}: {key}: {exc}") from None


def _workload(
    source: str, index: int, table: Any, defaults: dict[str, Any], base: Path
) -> GridWorkload:
    where = f"workloads[{index}]"
    if not isinstance(table, dict):
        raise InputError(f"{source}: {where}: expected a table, got {_type_name(table)}")
    _unknown_keys(source, f"{where}.", table, WORKLOAD_KEYS)
    dataset = table.get("dataset", DEFAULT_DATASET)
    if not isinstance(dataset, str) or not dataset.strip():
        raise InputError(f"{source}: {where}.dataset: expected a non-empty string, got {dataset!r}")
    name = table.get("name", dataset)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{source}: {where}.name: expected a non-empty string, got {name!r}")
    if Path(dataset).suffix.lower() in (".csv", ".parquet", ".jsonl"):
        given = dataset
        dataset = _path(base, dataset)
        if not Path(dataset).is_file():
            raise InputError(f"{source}: {where}.dataset: {given}: no such file")
    elif dataset not in KNOWN_NAMES:
        raise InputError(
            f"{source}: {where}.dataset: unknown workload {dataset!r} (known: "
            f"{', '.join(KNOWN_NAMES)}, or a .csv/.parquet/.jsonl file)"
        )
    merged = dict(defaults)
    for key in ("max_concurrency", "request_rate", "num_prompts_per_concurrency", "num_prompts"):
        if key in table:
            merged[key] = table[key]
    has_c = "max_concurrency" in merged
    concurrencies: list[int | None] = (
        list(_ints(source, f"{where}.max_concurrency", merged["max_concurrency"], 1))
        if has_c
        else [None]
    )
    rates = (
        _rates(source, f"{where}.request_rate", merged["request_rate"])
        if "request_rate" in merged
        else [math.inf]
    )
    per_c = merged.get("num_prompts_per_concurrency")
    fixed_n = merged.get("num_prompts")
    if "num_prompts" in table and "num_prompts_per_concurrency" in table:
        raise InputError(f"{source}: {where}: give num_prompts or num_prompts_per_concurrency")
    if "num_prompts" in table:
        per_c = None
    if "num_prompts_per_concurrency" in table:
        fixed_n = None
    if per_c is not None:
        per_c = _one_int(source, f"{where}.num_prompts_per_concurrency", per_c)
    if fixed_n is not None:
        fixed_n = _one_int(source, f"{where}.num_prompts", fixed_n)
    if fixed_n is None and per_c is None:
        per_c = DEFAULT_PROMPTS_PER_CONCURRENCY
    if fixed_n is None and per_c is not None and has_c:
        largest = per_c * max(c for c in concurrencies if c is not None)
        if largest > MAX_COUNT:
            raise InputError(
                f"{source}: {where}: num_prompts_per_concurrency x max_concurrency = {largest} "
                "prompts (at most 2**53)"
            )
    if not has_c and math.inf in rates:
        raise InputError(
            f"{source}: {where}: request_rate inf without max_concurrency sends every request "
            "at t=0 with no cap; give max_concurrency or a finite request_rate"
        )
    fields: list[tuple[str, Any]] = []
    for key in WORKLOAD_FIELDS:
        if key in table:
            value = table[key]
            fields.append(
                (key, _nested(source, f"{where}.{key}", value) if key in _NESTED else value)
            )
    _check_fields(source, f"{where}.", dict(fields))
    return GridWorkload(
        name=name,
        dataset=dataset,
        max_concurrency=tuple(concurrencies),
        request_rate=tuple(rates),
        num_prompts_per_concurrency=per_c,
        num_prompts=fixed_n,
        fields=tuple(fields),
    )


def parse_grid(data: dict[str, Any], source: str, base_dir: str | Path = ".") -> SweepGrid:
    """Check a parsed TOML document; paths relative to `base_dir`. InputError names the key."""
    base = Path(base_dir)
    _unknown_keys(source, "", data, TOP_KEYS)
    for key in ("profile", "policies"):
        if key not in data:
            raise InputError(f"{source}: {key}: missing (required)")
    profiles = [_path(base, p) for p in _strings(source, "profile", data["profile"])]
    for given, path in zip(_as_list(source, "profile", data["profile"]), profiles, strict=True):
        if not Path(path).is_file():
            raise InputError(f"{source}: profile: {given}: no such file")
    policies = [
        _user_policy(source, base, spec) for spec in _strings(source, "policies", data["policies"])
    ]
    seeds = _ints(source, "seeds", data.get("seeds", [0]), 0, maximum_power=64)
    scheduling = _strings(source, "scheduling", data.get("scheduling", ["sync"]))
    for mode in scheduling:
        if mode not in ("sync", "async"):
            raise InputError(f'{source}: scheduling: expected "sync" or "async", got {mode!r}')
    if "num_prompts" in data and "num_prompts_per_concurrency" in data:
        raise InputError(f"{source}: give num_prompts or num_prompts_per_concurrency, not both")
    defaults: dict[str, Any] = {
        key: data[key]
        for key in ("max_concurrency", "request_rate", "num_prompts_per_concurrency", "num_prompts")
        if key in data
    }
    tables = data.get("workloads", [{}])
    if not isinstance(tables, list):
        raise InputError(f"{source}: workloads: expected an array of tables ([[workloads]])")
    if not tables:
        raise InputError(f"{source}: workloads: empty list (give at least one value)")
    workloads = [_workload(source, i, t, defaults, base) for i, t in enumerate(tables)]
    _unique(source, "workloads (name)", [w.name for w in workloads])
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise InputError(f"{source}: config: expected a table, got {_type_name(config)}")
    _unknown_keys(source, "config.", config, CONFIG_KEYS)
    fixed: list[tuple[str, Any]] = []
    swept: list[tuple[str, tuple[Any, ...]]] = []
    for key, value in config.items():
        if key == "category_acceptance":
            fixed.append((key, _category_acceptance(source, value)))
            continue
        values = [math.inf if v == "inf" else v for v in _as_list(source, f"config.{key}", value)]
        for item in values:
            _check_fields(source, "config.", {key: item})
        if isinstance(value, list):
            _unique(source, f"config.{key}", values)
            swept.append((key, tuple(values)))
        else:
            fixed.append((key, values[0]))
    num_cells = (
        len(profiles)
        * sum(len(w.max_concurrency) * len(w.request_rate) for w in workloads)
        * math.prod(len(values) for _, values in swept)
        * len(scheduling)
        * len(seeds)
        * len(policies)
    )
    if num_cells > MAX_GRID_CELLS:
        raise InputError(
            f"{source}: the grid expands to {num_cells} cells (at most {MAX_GRID_CELLS}); "
            "split it into smaller grids"
        )
    grid = SweepGrid(
        source=source,
        profiles=tuple(profiles),
        policies=tuple(policies),
        seeds=tuple(seeds),
        scheduling=tuple(scheduling),
        workloads=tuple(workloads),
        fixed=tuple(fixed),
        swept=tuple(swept),
    )
    expand_grid(grid)  # every cell's config is validated here, so errors name the key now
    return grid


def load_grid(path: str | Path) -> SweepGrid:
    """Read and check a grid file (one-line InputError naming the file and key)."""
    source = str(path)
    # not a directory, FIFO or device; a BOM is dropped; a bad byte named by line/column
    text = read_user_text(path, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: invalid TOML: {exc}") from None
    except RecursionError:  # arrays nested thousands deep
        raise InputError(f"{source}: invalid TOML: nested too deeply") from None
    return parse_grid(data, source, Path(path).resolve().parent)


def _product(axes: Sequence[tuple[str, tuple[Any, ...]]]) -> list[tuple[tuple[str, Any], ...]]:
    """Every combination of the axes, the first axis outermost."""
    combos: list[tuple[tuple[str, Any], ...]] = [()]
    for key, values in axes:
        combos = [(*combo, (key, value)) for combo in combos for value in values]
    return combos


def expand_grid(grid: SweepGrid) -> list[SweepCell]:
    """The cells in the documented order (docs/sweeps.md, "Expansion order")."""
    cells: list[SweepCell] = []
    many_profiles = len(grid.profiles) > 1
    for profile in grid.profiles:
        for workload in grid.workloads:
            for swept in _product(grid.swept):
                for mode in grid.scheduling:
                    for concurrency in workload.max_concurrency:
                        for rate in workload.request_rate:
                            for sweep_seed in grid.seeds:
                                for policy in grid.policies:
                                    cells.append(
                                        _cell(
                                            grid,
                                            len(cells),
                                            profile,
                                            workload,
                                            swept,
                                            mode,
                                            concurrency,
                                            rate,
                                            sweep_seed,
                                            policy,
                                            many_profiles,
                                        )
                                    )
    return cells


def _cell(
    grid: SweepGrid,
    index: int,
    profile: str,
    workload: GridWorkload,
    swept: tuple[tuple[str, Any], ...],
    mode: str,
    concurrency: int | None,
    rate: float,
    sweep_seed: int,
    policy: str,
    many_profiles: bool,
) -> SweepCell:
    if workload.num_prompts is not None:
        count: int | None = workload.num_prompts
    elif concurrency is not None and workload.num_prompts_per_concurrency is not None:
        count = workload.num_prompts_per_concurrency * concurrency
    else:
        count = None
    fields: dict[str, Any] = {**dict(workload.fields), **dict(grid.fixed), **dict(swept)}
    try:
        config = RunConfig(
            profile=profile,
            policy=policy,
            dataset=workload.dataset,
            num_prompts=count,
            max_concurrency=concurrency,
            request_rate=rate,
            scheduling=mode,  # type: ignore[arg-type]
            seed=load_seed(sweep_seed, concurrency, rate),
            **fields,
        )
    except InputError as exc:
        raise InputError(f"{grid.source}: {exc}") from None
    except TypeError as exc:
        raise InputError(f"{grid.source}: config: {exc}") from None
    labels: list[tuple[str, Any]] = [("workload", workload.name)]
    if many_profiles:
        labels.append(("profile", Path(profile).name))
    labels += [(key, _label_value(value)) for key, value in swept]
    return SweepCell(
        index=index,
        policy=policy,
        max_concurrency=concurrency,
        config=config,
        labels=tuple(labels),
        sweep_seed=sweep_seed,
    )


def _label_value(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)
