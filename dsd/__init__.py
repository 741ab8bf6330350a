"""dsd: dynamic speculative decoding research. `import dsd` is the Python API (`dsd.api`).

The API is loaded on first use (`dsd.simulate`, ...), so importing a subpackage or starting the
`dsd` command does not pay for it. docs/architecture.md is the map of the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The public API: defined in dsd.api, loaded on first use.
__all__ = [
    "PolicyExplanation",
    "RunOutcome",
    "SweepOutcome",
    "check_policy",
    "distill_draft",
    "explain_policy",
    "export_pr32374",
    "export_sglang",
    "export_trtllm",
    "export_vllm",
    "generate",
    "hardware_report",
    "load_pair",
    "load_profile",
    "parse_policy",
    "profile",
    "report",
    "run",
    "run_config",
    "simulate",
    "sweep",
    "train_pair",
    "validate",
    "validate_vllm",
    "workload",
]

if TYPE_CHECKING:
    from dsd.api import (
        PolicyExplanation,
        RunOutcome,
        SweepOutcome,
        check_policy,
        distill_draft,
        explain_policy,
        export_pr32374,
        export_sglang,
        export_trtllm,
        export_vllm,
        generate,
        hardware_report,
        load_pair,
        load_profile,
        parse_policy,
        profile,
        report,
        run,
        run_config,
        simulate,
        sweep,
        train_pair,
        validate,
        validate_vllm,
        workload,
    )


def __getattr__(name: str) -> Any:
    import importlib

    if name in __all__:
        return getattr(importlib.import_module("dsd.api"), name)
    raise AttributeError(f"module 'dsd' has no attribute {name!r}")
