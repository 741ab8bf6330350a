"""`python -m dsd ...` is the `dsd` command (for checkouts and machines without its script)."""

from dsd.cli import main

if __name__ == "__main__":
    main()
