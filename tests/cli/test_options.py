"""dsd.cli.flags: each flag is declared once and every command that takes it shows the same
flag; flag defaults are the API's defaults; commands pass on only the flags the user gave; the
workload knobs (`WorkloadOptions`) become the traces objects field by field, with the same
errors from every command."""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st

from dsd import api
from dsd.cli import app, flags, main
from dsd.common.errors import InputError
from dsd.sim.config import RunConfig
from dsd.traces.datasets import RandomLengths
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import DEFAULT_DATASET, WorkloadOptions, build_workload, dataset_source
from dsd.traces.rollout import RolloutConfig

WORKLOAD_FIELDS = tuple(field.name for field in dataclasses.fields(WorkloadOptions))

# (command path, the flag groups it takes, names of group flags it declares as its own)
COMMANDS: tuple[tuple[tuple[str, ...], tuple[flags.FlagGroup, ...], frozenset[str]], ...] = (
    (("simulate",), (flags.SOURCE, flags.REQUESTS, flags.ARRIVALS, flags.ENGINE,
                     flags.SIMULATOR, flags.SEED), frozenset()),
    # sweep's --max-concurrency is a list of C
    (("sweep",), (flags.SOURCE, flags.REQUESTS, flags.ARRIVALS, flags.ENGINE, flags.SIMULATOR,
                  flags.SEED), frozenset({"max_concurrency"})),
    (("run",), (flags.PAIR, flags.REAL, flags.SOURCE, flags.REQUESTS, flags.ARRIVALS,
                flags.ENGINE, flags.SEED), frozenset()),
    # validate sets num_prompts and the cap per cell
    (("validate",), (flags.PAIR, flags.SOURCE, flags.REQUEST_SHAPE, flags.ENGINE,
                     flags.SIMULATOR, flags.SEED), frozenset()),
    (("profile",), (flags.PAIR, flags.SEED), frozenset()),
    (("generate",), (flags.PAIR, flags.SEED), frozenset()),
    # the cap on requests in flight changes nothing `show` prints
    (("traces", "show"), (flags.REQUESTS, flags.ARRIVAL_TIMES, flags.SEED), frozenset()),
    (("traces", "convert"), (flags.REQUESTS, flags.ARRIVALS, flags.SEED), frozenset()),
    # a vLLM JSONL carries no arrival times and no cap
    (("traces", "export"), (flags.REQUESTS, flags.SEED), frozenset()),
)  # fmt: skip
COMMAND_IDS = [" ".join(path) for path, _, _ in COMMANDS]
ALL_GROUPS = {
    name: group
    for name, group in vars(flags).items()
    if name.isupper()
    and isinstance(group, dict)
    and group
    and all(isinstance(flag, flags.Flag) for flag in group.values())
    and name not in ("WORKLOAD",)
}


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


@pytest.mark.parametrize(("path", "groups", "own"), COMMANDS, ids=COMMAND_IDS)
def test_command_takes_exactly_the_flags_of_its_groups(
    path: tuple[str, ...], groups: tuple[flags.FlagGroup, ...], own: frozenset[str]
) -> None:
    declared = _options_of(path)
    taken = {name for group in groups for name in group}
    for name in taken:
        assert name in declared, f"dsd {' '.join(path)} lacks --{name.replace('_', '-')}"
    other_groups = {name for group in ALL_GROUPS.values() for name in group} - taken - own
    for name in other_groups & set(declared):
        # a command's own flag may share a name with a group flag it does not take
        assert name not in taken, f"dsd {' '.join(path)} declares --{name} twice"


def test_a_flag_is_the_same_in_every_command() -> None:
    """One flag, one declaration: spelling, default, help and flag-ness agree everywhere."""
    seen: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {}
    for path, groups, own in COMMANDS:
        declared = _options_of(path)
        for name in {n for group in groups for n in group} - own:
            option = declared[name]
            shape = (tuple(option.opts), repr(option.default), option.help, option.is_flag)
            first = seen.setdefault(name, (path, shape))
            assert shape == first[1], f"--{name}: dsd {' '.join(path)} != dsd {' '.join(first[0])}"


def _same_default(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    return bool(left == right)


def _api_default(name: str) -> Any:
    """The default the API applies when a flag is not given."""
    for cls in (WorkloadOptions, RunConfig):
        for field in dataclasses.fields(cls):
            if field.name == name:
                return field.default
    for function in (api.load_pair, api.run):
        parameters = inspect.signature(function).parameters
        if name in parameters:
            return parameters[name].default
    raise AssertionError(f"--{name}: no API default")


def test_flag_defaults_are_the_api_defaults() -> None:
    """The CLI passes on only the flags given, so the default --help shows must be the API's."""
    for group_name, group in ALL_GROUPS.items():
        for name, flag in group.items():
            if group_name == "SOURCE":
                assert flag.default is None  # dataset_source: None -> DEFAULT_DATASET
                continue
            assert _same_default(flag.default, _api_default(name)), f"--{name}"


def test_commands_pass_on_only_the_flags_given(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_simulate(**fields: Any) -> None:
        seen.update(fields)
        raise SystemExit(0)

    monkeypatch.setattr(api, "simulate", fake_simulate)
    with pytest.raises(SystemExit):
        main(["simulate", "--profile", "p.json", "--policy", "static:1", "--num-prompts", "3",
              "--seed", "0", "--latency-jitter", "0.5"])  # fmt: skip
    passed = {k for k in seen if seen[k] is not None} - {"keep_steps"}
    assert passed == {"profile", "policy", "num_prompts", "seed", "jitter_sigma"}


def test_default_options_give_the_traces_objects_defaults() -> None:
    arguments = WorkloadOptions().arguments()
    assert arguments["random_lengths"] == RandomLengths()
    assert arguments["trace_options"] == TraceOptions()
    assert arguments["rollout"] == RolloutConfig()
    assert arguments["chat_template"] is True and arguments["shuffle"] is False


def test_arguments_are_keywords_of_build_workload_and_run_config() -> None:
    keys = set(WorkloadOptions().arguments())
    assert keys <= set(inspect.signature(build_workload).parameters)
    assert keys <= {field.name for field in dataclasses.fields(RunConfig)}


# (option field, new value, argument key, attribute of that argument or None for the value)
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
def test_each_option_changes_only_its_own_argument(
    field: str, value: Any, key: str, attribute: str | None
) -> None:
    default = WorkloadOptions().arguments()
    changed = WorkloadOptions(**{field: value}).arguments()
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
            "out": st.just("not a workload field"),
            "policy": st.just("static:1"),
        },
    )
)
def test_from_values_takes_only_workload_fields(values: dict[str, Any]) -> None:
    options = WorkloadOptions.from_values(values)
    for field in WORKLOAD_FIELDS:
        expected = values.get(field, getattr(WorkloadOptions(), field))
        assert getattr(options, field) == expected


def test_run_config_takes_flat_fields_and_refuses_unknown_ones() -> None:
    config = api.run_config(profile="p.json", policy="static:1", random_input_len=64, k_max=2)
    assert config.random_lengths.input_len == 64 and config.k_max == 2
    with pytest.raises(InputError, match="unknown run field"):
        api.run_config(policy="static:1", no_such_field=1)


def test_bad_rollout_dist_is_an_input_error_naming_the_field() -> None:
    with pytest.raises(InputError, match=r"^rollout_dist: choose from lognormal, pareto; got"):
        WorkloadOptions(rollout_dist="weibull")


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


# (argv of a command given a bad workload flag; nothing runs before the check)
BAD_FLAG_COMMANDS: tuple[list[str], ...] = (
    ["simulate", "--profile", "x.json", "--policy", "static:1"],  # profile read later
    ["sweep", "--profile", "x.json", "--out", "{tmp}/sweep"],  # nothing written on error
    ["traces", "show", "rl-rollout"],
    ["traces", "convert", "rl-rollout", "--out", "{tmp}/w.csv"],
    ["traces", "export", "rl-rollout", "--out", "{tmp}/w.jsonl"],
    ["run", "--target", "tiny", "--out", "{tmp}/run"],  # checked before any model
)
# (bad flags, the one error line every command prints: the flag where the user typed the
# field's own flag, else the field the check is about)
BAD_FLAGS: tuple[tuple[list[str], str], ...] = (
    (["--rollout-dist", "x"], "error: --rollout-dist: choose from lognormal, pareto; got 'x'"),
    (["--fraction", "2"], "error: --fraction: must be in (0, 1], got 2.0"),
    (["--random-range-ratio", "1"], "error: --random-range-ratio: must be in [0, 1), got 1.0"),
    (["--rollout-max", "0"], "error: max_output_len: must be >= 1, got 0"),
    # several bad: the random lengths are checked before the trace options and the rollout
    (
        ["--rollout-max", "0", "--end-s", "0", "--random-input-len", "0"],
        "error: --random-input-len",
    ),
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


def test_progress_off_a_terminal_prints_a_line_a_minute_and_nothing_for_short_work(
    monkeypatch, capsys
) -> None:
    """Where rich draws no bar (stderr is a file here), long work still shows in the log."""
    import time

    clock = iter([0.0, 10.0, 61.0, 70.0, 200.0])  # start, then one reading per unit
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    with flags.progress_bar(4, "profiling") as advance:
        for label in ("round 1", "round 2", "round 3", "round 4"):
            advance(label)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["profiling: 2/4 round 2, 61 s", "profiling: 4/4 round 4, 200 s"]
    clock = iter([0.0, 1.0, 2.0])
    with flags.progress_bar(2, "sweep") as advance:
        advance("a")
        advance("b")
    assert capsys.readouterr().err == ""


def test_progress_grows_its_total_when_the_work_adds_units(monkeypatch, capsys) -> None:
    """A re-measure pass adds its rounds to the total as it starts: never `5/3`."""
    import time

    clock = iter([0.0, 61.0, 122.0, 183.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    with flags.progress_bar(2, "profiling") as advance:
        advance("round 1")
        advance("re-measure round 1", 1)
        advance("re-measure round 2")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "profiling: 1/2 round 1",
        "profiling: 2/3 re-measure round 1",
        "profiling: 3/3 re-measure round 2",
    ]
