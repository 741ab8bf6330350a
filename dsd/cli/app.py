"""The `dsd` command: one typer app; each command group lives in its own `dsd/cli/*.py`.

This module only assembles the app and enforces the error contract: bad user input
(`dsd.common.errors.InputError`, missing files, bad flags, an OS error about a named path)
prints one line `error: ...` on stderr and exits with code 2, with no traceback; a sweep whose
worker process died prints one line and exits 1 (finished cells are kept), and one stopped by
Ctrl-C or SIGTERM says what it kept and exits 128 + the signal's number; any other command
stopped by Ctrl-C prints `interrupted` and exits 130; outputs are written atomically by the
API, so a failed or stopped command leaves nothing half-written.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer

from dsd.cli import (
    check_policy,
    export,
    flags,
    hardware,
    profile,
    report,
    run,
    simulate,
    traces,
    validate,
    zoo,
)
from dsd.cli.flags import flag_of
from dsd.common import invocation
from dsd.common.errors import InputError, StoppedBySignal, WorkerDied
from dsd.common.user_paths import os_error_reason

# Newer typer releases bundle their own copy of click and raise flag errors from it; older ones
# use the click package. Import only the one typer uses: the click package on top of the bundled
# copy cost 40 ms of every command's start. typer.Exit and typer.Abort are what both raise.
# NoArgsIsHelpError (click >= 8.2) carries the help of `dsd` or a command group given alone;
# older clicks show that help and exit themselves.
try:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    from typer._click.utils import make_default_short_help
except ImportError:  # pragma: no cover - older typer
    from click import exceptions as _click_exceptions
    from click.utils import make_default_short_help  # type: ignore[no-redef]

    ClickException = _click_exceptions.ClickException  # type: ignore[misc,assignment]
    NoArgsIsHelpError = getattr(_click_exceptions, "NoArgsIsHelpError", ())  # type: ignore[misc,arg-type]

app = typer.Typer(
    name="dsd",
    help="Dynamic speculative decoding: K policies, a serving simulator, a real SD engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: typer's rich help imports rich's markdown and traceback renderers
    # (+0.2 s, twice the rest of a start on the 2-core host; docs/simulator.md "Speed")
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from dsd import __version__

        print(f"dsd {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print dsd's version."
        ),
    ] = False,
) -> None:
    pass  # the options above act in their callbacks; the app's help is Typer(help=...)


for _module in (
    export,
    simulate,
    traces,
    run,
    profile,
    validate,
    hardware,
    report,
    zoo,
    check_policy,
):
    _module.register(app)


def _fill_policy_names(command: Any, args: list[str]) -> None:
    """For `--help` of a command whose help says `flags.POLICY_NAMES`: put the registered
    policies' names there (importing them only then keeps every other start quick)."""
    for word in args:  # the command the help is for: `dsd export vllm --help` -> vllm
        command = getattr(command, "commands", {}).get(word, command)
    params = [p for p in command.params if flags.POLICY_NAMES in (getattr(p, "help", "") or "")]
    if params:
        from dsd import api

        for param in params:
            param.help = param.help.replace(flags.POLICY_NAMES, ", ".join(api.policy_names()))


def _full_short_help(command: Any) -> None:
    """Give every subcommand its whole first sentence as the line a group's help lists (click
    cuts it at about 45 characters, mid-phrase)."""
    for sub in getattr(command, "commands", {}).values():
        if not sub.short_help and sub.help:
            sub.short_help = make_default_short_help(sub.help, sys.maxsize)
        _full_short_help(sub)


def fail(message: str) -> None:
    """Print the one-line error and exit 2."""
    first_line = " ".join(str(message).split())
    print(f"error: {first_line}", file=sys.stderr)
    raise SystemExit(2)


def flag_message(message: str, argv: list[str]) -> str:
    """The API's errors name fields (`threads: ...`, `time_budget_s 0: ...`); where the user
    typed that field's flag, the command line says the flag instead (`--threads: ...`)."""
    match = re.match(r"([a-z][a-z0-9_]*)(?=[: ])", message)
    if match is None:
        return message
    flag = flag_of(match.group(1))
    if flag not in {arg.split("=", 1)[0] for arg in argv}:
        return message
    return flag + message[match.end() :]


def _path_of(error: OSError) -> str:
    """The path an OS error is about (the second one of a rename when the first is missing)."""
    path = error.filename if error.filename is not None else error.filename2
    return str(path) if path is not None else str(error)


class _CtrlC:
    """Notes a Ctrl-C (SIGINT) while the command runs: typer turns its KeyboardInterrupt into a
    silent exit code 130 (older releases: an Abort), so main() cannot tell it apart otherwise.
    The interrupt is raised as before; a SIGINT the caller ignores (nohup) stays ignored."""

    def __init__(self) -> None:
        self.seen = False
        self._installed = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True
        signal.default_int_handler(signum, frame)

    def __enter__(self) -> _CtrlC:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signal.signal(signal.SIGINT, self._note)
            self._installed = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupted() -> NoReturn:
    """Print the one line of a command stopped by Ctrl-C and exit 130 (128 + SIGINT)."""
    print("interrupted", file=sys.stderr)
    raise SystemExit(130)


def main(argv: list[str] | None = None) -> None:
    argv_given = sys.argv[1:] if argv is None else argv
    invocation.record(argv_given)
    ctrl_c = _CtrlC()
    try:
        with ctrl_c:
            command = typer.main.get_command(app)
            _full_short_help(command)
            args = sys.argv[1:] if argv is None else argv
            if "--help" in args:
                _fill_policy_names(command, args)
            result = command.main(args=argv, prog_name="dsd", standalone_mode=False)
    except KeyboardInterrupt:  # before typer ran the command
        interrupted()
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        if ctrl_c.seen:
            interrupted()
        fail("aborted")
    except NoArgsIsHelpError as exc:  # its help as it is, not squeezed onto one error line
        print(exc.format_message(), file=sys.stderr)
        raise SystemExit(2) from None
    except ClickException as exc:  # bad flags, missing options, bad values
        fail(exc.format_message())
    except InputError as exc:
        fail(flag_message(str(exc), argv_given))
    except WorkerDied as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except StoppedBySignal as exc:  # what was kept, and how to resume
        print(str(exc), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except FileNotFoundError as exc:
        fail(f"{_path_of(exc)}: no such file or folder")
    except IsADirectoryError as exc:
        fail(f"{_path_of(exc)}: is a directory, expected a file")
    except PermissionError as exc:
        fail(f"{_path_of(exc)}: permission denied")
    except OSError as exc:  # about a path the user gave (a name too long, a busy folder, ...)
        if exc.filename is None and exc.filename2 is None:
            raise
        fail(f"{_path_of(exc)}: {os_error_reason(exc)}")
    if ctrl_c.seen and result == 130:  # typer's exit code for a KeyboardInterrupt
        interrupted()
    if isinstance(result, int) and result != 0:
        raise SystemExit(result)


if __name__ == "__main__":
    main()
