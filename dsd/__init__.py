"""The `dsd` command: the app layer that wires policies, sim, backend, traces and reports."""

__version__ = "0.1.0"
