"""`python -m dsd.cli ...` runs the `dsd` command."""

from dsd.cli.app import main

main()
