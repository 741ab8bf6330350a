"""The `dsd` command (entry point `dsd.cli:main`)."""

from dsd.cli.app import app, main

__all__ = ["app", "main"]
