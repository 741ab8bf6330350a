"""The `dsd` command: one typer app; each command group lives in its own `dsd/cmd_*.py`.

This module only assembles the app and enforces the error contract: bad user input
(`policies.errors.InputError`, missing files, bad flags) prints one line `error: ...` on stderr
and exits with code 2, with no traceback; outputs are written atomically by the commands, so a
failed command leaves nothing half-written.
"""

from __future__ import annotations

import sys
from typing import cast

import click
import typer

from dsd.cli import export as cmd_export
from dsd.cli import invocation
from dsd.cli import report as cmd_report
from dsd.cli import run as cmd_backend
from dsd.cli import simulate as cmd_sim
from dsd.cli import traces as cmd_traces
from dsd.cli import validate as cmd_validate
from dsd.cli import zoo as cmd_zoo
from dsd.common.errors import InputError


# Newer typer releases bundle their own copy of click and raise flag errors from it; older ones
# use the click package. Catch both families.
def _typer_click_exception() -> type[click.ClickException]:
    try:
        from typer._click.exceptions import ClickException
    except ImportError:  # pragma: no cover - older typer
        return click.ClickException
    return cast("type[click.ClickException]", ClickException)


# Both have format_message(); the bundled one is typed as the click one.
_CLICK_ERRORS: tuple[type[click.ClickException], ...] = (
    click.ClickException,
    _typer_click_exception(),
)
_EXITS = (click.exceptions.Exit, typer.Exit)
_ABORTS = (click.exceptions.Abort, typer.Abort)

app = typer.Typer(
    name="dsd",
    help="Dynamic speculative decoding: K policies, a serving simulator, a real SD engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for _module in (cmd_export, cmd_sim, cmd_traces, cmd_backend, cmd_validate, cmd_report, cmd_zoo):
    _module.register(app)


def fail(message: str) -> None:
    """Print the one-line error and exit 2."""
    first_line = " ".join(str(message).split())
    print(f"error: {first_line}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    invocation.record(sys.argv[1:] if argv is None else argv)
    try:
        result = app(args=argv, standalone_mode=False)
    except _EXITS as exc:
        raise SystemExit(exc.exit_code) from None
    except _ABORTS:
        fail("aborted")
    except _CLICK_ERRORS as exc:  # bad flags, missing options, bad values
        fail(exc.format_message())
    except InputError as exc:
        fail(str(exc))
    except FileNotFoundError as exc:
        fail(f"{exc.filename}: no such file")
    except IsADirectoryError as exc:
        fail(f"{exc.filename}: is a directory, expected a file")
    except PermissionError as exc:
        fail(f"{exc.filename}: permission denied")
    if isinstance(result, int) and result != 0:
        raise SystemExit(result)


if __name__ == "__main__":
    main()
