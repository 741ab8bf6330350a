"""dsd.options: every command that takes a workload flag declares it the same way (flag name,
default, help, type) as dsd.options says, the full-set commands take every workload flag, and
`WorkloadFlags` turns values into the traces objects field by field, with the same errors from
every command."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from typing import Any

import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st

from dsd.cli import app, main
from dsd.cli import flags as options
from dsd.cli.flags import DEFAULT_DATASET, WorkloadFlags, dataset_source
from dsd.common.errors import InputError
from dsd.traces.datasets import RandomLengths
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import build_workload
from dsd.traces.rollout import RolloutConfig

WORKLOAD_FIELDS = tuple(field.name for field in dataclasses.fields(WorkloadFlags))
# Flags of the workload besides the WorkloadFlags fields: the simulator's source.
SOURCE_FLAGS = ("dataset_name", "dataset_path")
# --seed: shared name and default, but its help says what each command seeds (weights in
# `dsd run`, acceptance and noise in the simulator), so it has no shared alias.
SEED = "seed"

# (command path, workload flags it does not take, flags of the same name it declares as its own)
COMMANDS: tuple[tuple[tuple[str, ...], frozenset[str], frozenset[str]], ...] = (
    # the full set, and the simulator's dataset source
    (("simulate",), frozenset(), frozenset()),
    # sweep's own --num-prompts (one count for every cell) and --max-concurrency (a list of C)
    (("sweep",), frozenset(), frozenset({"num_prompts", "max_concurrency"})),
    # the source is a positional argument
    (("traces", "show"), frozenset(SOURCE_FLAGS), frozenset()),
    # a table has no concurrency cap
    (("traces", "convert"), frozenset({*SOURCE_FLAGS, "max_concurrency"}), frozenset()),
    # a vLLM JSONL carries no arrival times and no cap
    (
        ("traces", "export"),
        frozenset({*SOURCE_FLAGS, "max_concurrency", "request_rate", "burstiness"}),
        frozenset(),
    ),
    # the real engine: every workload flag; its --dataset-name is its own (default mt-bench
    # shown in --help, no --dataset-path)
    (("run",), frozenset({"dataset_path"}), frozenset({"dataset_name"})),
)
COMMAND_IDS = [" ".join(path) for path, _, _ in COMMANDS]


def _alias_name(flag_name: str) -> str:
    """options.NumPrompts for num_prompts, options.StartS for start_s."""
    return "".join(part.capitalize() for part in flag_name.split("_"))


def _alias_option(flag_name: str) -> tuple[Any, Any]:
    """(value type, typer OptionInfo) of the shared alias of a flag."""
    alias = getattr(options, _alias_name(flag_name))
    value_type, option_info = typing.get_args(alias)
    return value_type, option_info


def _click_command(path: tuple[str, ...]) -> Any:
    """The click command of `dsd PATH` (typer may bundle its own click: no isinstance checks)."""
    command = typer.main.get_command(app)
    for word in path:
        command = command.commands[word]  # type: ignore[attr-defined]
    return command


def _options_of(path: tuple[str, ...]) -> dict[str, Any]:
    return {
        param.name: param
        for param in _click_command(path).params
        if param.param_type_name == "option"
    }


def _same_default(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    return bool(left == right) and type(left) is type(right)


def _default_of(flag_name: str) -> Any:
    if flag_name in SOURCE_FLAGS:
        return None  # the simulator resolves None to DEFAULT_DATASET (dataset_source)
    return next(f.default for f in dataclasses.fields(WorkloadFlags) if f.name == flag_name)


def _shared(not_taken: frozenset[str], own: frozenset[str]) -> list[str]:
    """The workload flags a command takes with the shared declaration."""
    return [name for name in (*WORKLOAD_FIELDS, *SOURCE_FLAGS) if name not in not_taken | own]


@pytest.mark.parametrize(("path", "not_taken", "own"), COMMANDS, ids=COMMAND_IDS)
def test_command_takes_exactly_its_workload_flags(
    path: tuple[str, ...], not_taken: frozenset[str], own: frozenset[str]
) -> None:
    declared = _options_of(path)
    for name in [*_shared(not_taken, own), *own]:
        assert name in declared, f"dsd {' '.join(path)} lacks --{name.replace('_', '-')}"
    for name in not_taken:
        assert name not in declared, f"dsd {' '.join(path)} takes --{name.replace('_', '-')}"


@pytest.mark.parametrize(("path", "not_taken", "own"), COMMANDS, ids=COMMAND_IDS)
def test_workload_flags_are_declared_as_options_says(
    path: tuple[str, ...], not_taken: frozenset[str], own: frozenset[str]
) -> None:
    declared = _options_of(path)
    for name in _shared(not_taken, own):
        option = declared[name]
        where = f"dsd {' '.join(path)} --{name}"
        assert _same_default(option.default, _default_of(name)), f"{where}: default"
        if name == SEED:
            assert option.opts == ["--seed"], where
            continue
        _, option_info = _alias_option(name)
        flag = option_info.default if isinstance(option_info.default, str) else None
        assert option.opts == [flag or "--" + name.replace("_", "-")], f"{where}: flag name"
        assert option.help == option_info.help, f"{where}: help"


def test_shared_flags_are_identical_across_commands() -> None:
    """One flag, one declaration: flag name, default, help and flag-ness agree."""
    seen: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {}
    for path, not_taken, own in COMMANDS:
        declared = _options_of(path)
        for name in _shared(not_taken, own):
            option = declared[name]
            help_text = None if name == SEED else option.help
            shape = (
                tuple(option.opts),
                repr(option.default),
                help_text,
                option.is_flag,
            )
            first = seen.setdefault(name, (path, shape))
            assert shape == first[1], f"--{name}: dsd {' '.join(path)} != dsd {' '.join(first[0])}"


def _command_function(path: tuple[str, ...]) -> Any:
    """The Python function behind `dsd PATH`, as registered with typer."""
    registered = app
    for word in path[:-1]:
        group = next(g for g in registered.registered_groups if g.name == word)
        assert group.typer_instance is not None
        registered = group.typer_instance
    command = next(c for c in registered.registered_commands if c.name == path[-1])
    return command.callback


@pytest.mark.parametrize(("path", "not_taken", "own"), COMMANDS, ids=COMMAND_IDS)
def test_commands_annotate_workload_flags_with_the_shared_alias(
    path: tuple[str, ...], not_taken: frozenset[str], own: frozenset[str]
) -> None:
    """The very alias object of dsd.options (so the type and the Option cannot drift)."""
    parameters = inspect.signature(_command_function(path), eval_str=True).parameters
    for name in _shared(not_taken, own):
        if name == SEED:
            continue
        alias = getattr(options, _alias_name(name))
        assert parameters[name].annotation is alias, f"dsd {' '.join(path)} {name}"


def test_every_workload_field_has_a_shared_alias() -> None:
    for name in (*WORKLOAD_FIELDS, *SOURCE_FLAGS):
        if name == SEED:
            continue
        _, option_info = _alias_option(name)
        assert isinstance(option_info, typer.models.OptionInfo), name
        assert option_info.help, name


def test_default_flags_give_the_traces_objects_defaults() -> None:
    arguments = WorkloadFlags().arguments()
    assert arguments["random_lengths"] == RandomLengths()
    assert arguments["trace_options"] == TraceOptions()
    assert arguments["rollout"] == RolloutConfig()
    assert arguments["chat_template"] is True and arguments["shuffle"] is False


def test_arguments_are_keywords_of_build_workload_and_simulation_config() -> None:
    from dsd.sim.runner import SimulationConfig

    keys = set(WorkloadFlags().arguments())
    assert keys <= set(inspect.signature(build_workload).parameters)
    assert keys <= {field.name for field in dataclasses.fields(SimulationConfig)}


# (flag field, new value, argument key, attribute of that argument or None for the value itself)
FIELD_ROUTES: tuple[tuple[str, Any, str, str | None], ...] = (
    ("num_prompts", 7, "num_prompts", None),  # passed through
    ("max_concurrency", 3, "max_concurrency", None),  # passed through
    ("request_rate", 2.5, "request_rate", None),  # passed through
    ("burstiness", 0.5, "burstiness", None),  # passed through
    ("output_len", 9, "output_len", None),  # passed through
    ("raw_prompt", True, "chat_template", None),  # inverted: --raw-prompt drops the template
    ("shuffle", True, "shuffle", None),  # passed through
    ("random_input_len", 64, "random_lengths", "input_len"),
    ("random_output_len", 32, "random_lengths", "output_len"),
    ("random_range_ratio", 0.25, "random_lengths", "range_ratio"),
    ("time_scale", 2.0, "trace_options", "time_scale"),
    ("start_s", 5.0, "trace_options", "start_s"),
    ("end_s", 50.0, "trace_options", "end_s"),
    ("fraction", 0.5, "trace_options", "fraction"),
    ("num_rows", 11, "trace_options", "num_rows"),
    ("max_prompt_len", 100, "trace_options", "max_prompt_len"),
    ("max_output_len", 20, "trace_options", "max_output_len"),
    ("rollout_dist", "pareto", "rollout", "output_dist"),
    ("rollout_median", 99.0, "rollout", "output_median"),
    ("rollout_sigma", 0.5, "rollout", "output_sigma"),
    ("rollout_alpha", 2.5, "rollout", "pareto_alpha"),
    ("rollout_min", 12.0, "rollout", "pareto_min_len"),
    ("rollout_max", 77, "rollout", "max_output_len"),
    ("rollout_prompt_len", 33, "rollout", "prompt_len"),
    ("rollout_prompt_set", "gsm8k", "rollout", "prompt_set"),
    ("seed", 5, "seed", None),  # the run seed; the trace sampling seed below
)


def test_field_routes_cover_every_field() -> None:
    assert sorted(route[0] for route in FIELD_ROUTES) == sorted(WORKLOAD_FIELDS)


@pytest.mark.parametrize(("field", "value", "key", "attribute"), FIELD_ROUTES)
def test_each_flag_changes_only_its_own_argument(
    field: str, value: Any, key: str, attribute: str | None
) -> None:
    default = WorkloadFlags().arguments()
    changed = WorkloadFlags(**{field: value}).arguments()
    landed = changed[key] if attribute is None else getattr(changed[key], attribute)
    expected = (not value) if field == "raw_prompt" else value
    assert landed == expected
    differing = {name for name in default if default[name] != changed[name]}
    # The seed also seeds the trace row sampling.
    assert differing == ({"seed", "trace_options"} if field == "seed" else {key})
    if field == "seed":
        assert changed["trace_options"].seed == value


@given(
    values=st.fixed_dictionaries(
        {},
        optional={
            "num_prompts": st.integers(1, 50),
            "request_rate": st.floats(0.1, 100.0),
            "shuffle": st.booleans(),
            "raw_prompt": st.booleans(),
            "seed": st.integers(0, 2**32),
            "out": st.just("not a workload flag"),
            "policy": st.just("static:1"),
        },
    )
)
def test_from_values_takes_only_workload_fields(values: dict[str, Any]) -> None:
    flags = WorkloadFlags.from_values(values)
    for field in WORKLOAD_FIELDS:
        expected = values.get(field, getattr(WorkloadFlags(), field))
        assert getattr(flags, field) == expected


def test_bad_rollout_dist_is_an_input_error_naming_the_flag() -> None:
    with pytest.raises(InputError, match=r"^--rollout-dist: choose from lognormal, pareto; got"):
        WorkloadFlags(rollout_dist="weibull")


# (dataset_name, dataset_path, source or error pattern)
DATASET_CASES: tuple[tuple[str | None, str | None, str], ...] = (
    (None, None, DEFAULT_DATASET),  # nothing given: the default prompt set
    ("gsm8k", None, "gsm8k"),  # a name
    ("w.csv", None, "w.csv"),  # a file through --dataset-name
    (None, "w.csv", "w.csv"),  # a file through --dataset-path
    ("custom", "w.csv", "w.csv"),  # vLLM's spelling
    ("custom", None, "error:needs --dataset-path"),  # custom without a file
    ("gsm8k", "w.csv", "error:give one"),  # both
)


@pytest.mark.parametrize(("name", "path", "expected"), DATASET_CASES)
def test_dataset_source(name: str | None, path: str | None, expected: str) -> None:
    if expected.startswith("error:"):
        with pytest.raises(InputError, match=expected.removeprefix("error:")):
            dataset_source(name, path)
    else:
        assert dataset_source(name, path) == expected


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


# (argv of a command given a bad workload flag; the simulator runs nothing before the check)
BAD_FLAG_COMMANDS: tuple[list[str], ...] = (
    ["simulate", "--profile", "x.json", "--policy", "static:1"],  # profile read later
    ["sweep", "--profile", "x.json", "--out", "{tmp}/sweep"],  # nothing written on error
    ["traces", "show", "rl-rollout"],
    ["traces", "convert", "rl-rollout", "--out", "{tmp}/w.csv"],
    ["traces", "export", "rl-rollout", "--out", "{tmp}/w.jsonl"],
    ["run", "--target", "tiny", "--output", "{tmp}/run.json"],  # checked before any model
)
# (bad flags, the one error line every command prints)
BAD_FLAGS: tuple[tuple[list[str], str], ...] = (
    (["--rollout-dist", "x"], "error: --rollout-dist: choose from lognormal, pareto; got 'x'"),
    (["--fraction", "2"], "error: fraction: must be in (0, 1], got 2.0"),
    (["--random-range-ratio", "1"], "error: random_range_ratio: must be in [0, 1), got 1.0"),
    (["--rollout-max", "0"], "error: max_output_len: must be >= 1, got 0"),
    # several bad: the random lengths are checked before the trace options and the rollout
    (["--rollout-max", "0", "--end-s", "0", "--random-input-len", "0"], "error: random_input_len"),
)


@pytest.mark.parametrize("command", BAD_FLAG_COMMANDS, ids=lambda argv: " ".join(argv[:2]))
@pytest.mark.parametrize(("bad", "message"), BAD_FLAGS, ids=lambda v: str(v)[:30])
def test_bad_workload_flag_gives_the_same_error_in_every_command(
    command: list[str],
    bad: list[str],
    message: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in command] + bad
    code, err = _run_cli(argv, capsys)
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
