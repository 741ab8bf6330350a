"""The command line of the current `dsd` invocation, for the records that runs write beside outputs.

`dsd.cli.main(argv)` records its argv here, so runs started from Python (tests, notebooks) record
the command they really ran; otherwise the process's own sys.argv is used.
"""

from __future__ import annotations

import shlex
import sys

_recorded_argv: list[str] | None = None


def record(argv: list[str]) -> None:
    """Remember the arguments (without the program name) of the running command."""
    global _recorded_argv
    _recorded_argv = list(argv)


def command_line() -> str:
    """The exact command as a shell would take it: `dsd <args...>`."""
    args = _recorded_argv if _recorded_argv is not None else sys.argv[1:]
    return shlex.join(["dsd", *args])
