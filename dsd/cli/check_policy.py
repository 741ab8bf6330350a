"""`dsd check-policy SPEC`: scheduler-accounting property tests on a policy (`api.check_policy`).

Runs the stateful scheduler machine with the policy choosing K, and the differential check
against vLLM's own scheduler where vLLM is installed (`sim.policy_check`). Prints each check's
verdict and, for a violation, hypothesis's shrunk reproducer; exits 1 when a violation is
found, 2 on a bad SPEC (one line).
"""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `check-policy` to the app."""

    @app.command("check-policy")
    def check_policy(
        spec: Annotated[
            str, typer.Argument(help="Policy SPEC: FILE.py:Class, module:Class or a built-in.")
        ],
        profile: Annotated[
            str | None, typer.Option(help="Profile JSON (for policies that read one).")
        ] = None,
        examples: Annotated[int, typer.Option(help="Examples of the stateful machine.")] = 100,
        steps: Annotated[int, typer.Option(help="Most machine calls per example.")] = 40,
        cases: Annotated[
            int, typer.Option(help="Random workloads against vLLM's scheduler (0: skip).")
        ] = 100,
        seed: Annotated[int, typer.Option(help="Seed of the differential workloads.")] = 0,
    ) -> None:
        """Property-test a K policy against the scheduler's accounting (and vLLM's scheduler)."""
        from dsd import api

        found = api.check_policy(
            spec, profile=profile, examples=examples, steps=steps, cases=cases, seed=seed
        )
        typer.echo(found.text())
        if not found.passed:
            raise typer.Exit(1)
