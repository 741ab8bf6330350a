"""A command's own flags default to what the API function they call defaults to: a default is
declared in the API's signature and the flag only spells it (comma lists as text)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import typer

from dsd.cli.app import app
from dsd.common.errors import int_list


def _profile_fn() -> Callable[..., Any]:
    from dsd.backend.profiling import profile_to_file

    return profile_to_file


def _validate_fn() -> Callable[..., Any]:
    from dsd.validation.pipeline import validate

    return validate


def _train_eagle_fn() -> Callable[..., Any]:
    from dsd.backend.eagle_train import EagleTrainConfig

    return EagleTrainConfig


def _hardware_fn() -> Callable[..., Any]:
    from dsd.validation.pipeline import hardware_report

    return hardware_report


# command -> (the API function, {flag parameter: API parameter} where the names differ)
COMMANDS: dict[str, tuple[Callable[[], Callable[..., Any]], dict[str, str]]] = {
    "profile": (
        _profile_fn,
        {"dataset_name": "dataset", "allow_noisy_profile": "allow_noisy"},
    ),
    "validate": (_validate_fn, {}),
    "zoo train-eagle": (_train_eagle_fn, {}),
    "hardware-report": (
        _hardware_fn,
        {"dataset_name": "dataset", "time_budget": "time_budget_s", "speedup_arm": "speedup_arms"},
    ),
}


def _as_api_value(flag_default: Any, api_default: Any) -> Any:
    if isinstance(flag_default, str) and isinstance(api_default, tuple):
        if api_default and isinstance(api_default[0], int):
            return int_list("default", flag_default, 0)
        return tuple(part for part in flag_default.split(",") if part)
    return flag_default


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_own_flag_defaults_are_the_api_functions_defaults(name: str) -> None:
    function_of, renamed = COMMANDS[name]
    api_parameters = inspect.signature(function_of()).parameters
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    checked = 0
    command = commands[name.split()[0]]
    for word in name.split()[1:]:  # a group's command
        command = command.commands[word]
    for param in command.params:
        api_name = renamed.get(str(param.name), str(param.name))
        if api_name not in api_parameters or param.default is None:
            continue
        api_default = api_parameters[api_name].default
        if api_default is inspect.Parameter.empty:
            continue
        assert _as_api_value(param.default, api_default) == api_default, (
            f"dsd {name} --{param.name}: {param.default!r} != API {api_default!r}"
        )
        checked += 1
    assert checked >= 3, f"dsd {name}: too few defaults compared ({checked})"
