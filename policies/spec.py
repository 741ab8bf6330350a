"""Policy SPEC strings -> KPolicy objects, through a plain registry dict.

SPEC grammar: `NAME[:ARGUMENT]`.

- `static:K`: the same K every step (0 <= K <= k_max).
- `table:JSON_OR_PATH`: a vLLM range table, inline (`table:[[1,8,3],[9,256,1]]`) or a JSON file
  holding the list or a speculative config with `num_speculative_tokens_per_batch_size`.
- `goodput`: PR #32374's rule on the profile (needs a profile).
- `online[:key=value,...]`: goodput with rates learnt at run time; keys are the fields of
  `policies.online.OnlineConfig` (warmup_steps, prior_strength, decay, recompute_tolerance).

New policies plug in by adding a builder to `POLICY_BUILDERS`. This module only parses; the
policies' semantics live in their own modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from policies.errors import InputError
from policies.goodput import GoodputPolicy
from policies.online import OnlineAcceptancePolicy, OnlineConfig
from policies.profile import Profile
from policies.range_table import RangeTablePolicy, read_ranges
from policies.static import StaticPolicy
from policies.types import KPolicy


@dataclass(frozen=True)
class PolicyContext:
    """What a builder may use besides its SPEC argument."""

    profile: Profile | None  # the loaded profile, if the command has one
    k_max: int  # num_speculative_tokens of the engine, >= 0
    max_num_seqs: int  # largest B the engine schedules, >= 1


PolicyBuilder = Callable[[str | None, PolicyContext], KPolicy]


def _no_argument(name: str, argument: str | None) -> None:
    if argument is not None:
        raise InputError(f"policy {name!r} takes no argument, got {name}:{argument}")


def _needs_profile(name: str, context: PolicyContext) -> Profile:
    if context.profile is None:
        raise InputError(f"policy {name!r} needs a profile (--profile)")
    return context.profile


def _build_static(argument: str | None, context: PolicyContext) -> KPolicy:
    if argument is None or not argument.strip().isdigit():
        raise InputError(f"policy 'static' needs an integer K >= 0 (static:K), got {argument!r}")
    k = int(argument)
    if k > context.k_max:
        raise InputError(f"policy static:{k}: K={k} exceeds k_max {context.k_max}")
    return StaticPolicy(k)


def _build_table(argument: str | None, context: PolicyContext) -> KPolicy:
    if not argument:
        raise InputError("policy 'table' needs a JSON list or a file path (table:JSON_OR_PATH)")
    return RangeTablePolicy(read_ranges(argument), context.k_max, context.max_num_seqs)


def _build_goodput(argument: str | None, context: PolicyContext) -> KPolicy:
    _no_argument("goodput", argument)
    return GoodputPolicy(_needs_profile("goodput", context), context.max_num_seqs)


def _parse_online_config(argument: str | None) -> OnlineConfig:
    if not argument:
        return OnlineConfig()
    fields = {f.name: f for f in dataclasses.fields(OnlineConfig)}
    values: dict[str, int | float] = {}
    for item in argument.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise InputError(
                f"policy 'online': expected key=value with key in {sorted(fields)}, got {item!r}"
            )
        default = getattr(OnlineConfig(), key)
        try:
            values[key] = int(raw) if isinstance(default, int) else float(raw)
        except ValueError:
            kind = "an integer" if isinstance(default, int) else "a number"
            raise InputError(f"policy 'online': {key} must be {kind}, got {raw!r}") from None
    return OnlineConfig(**values)  # type: ignore[arg-type]


def _build_online(argument: str | None, context: PolicyContext) -> KPolicy:
    config = _parse_online_config(argument)
    return OnlineAcceptancePolicy(_needs_profile("online", context), context.max_num_seqs, config)


POLICY_BUILDERS: dict[str, PolicyBuilder] = {
    "static": _build_static,
    "table": _build_table,
    "goodput": _build_goodput,
    "online": _build_online,
}


def parse_policy(spec: str, *, profile: Profile | None, k_max: int, max_num_seqs: int) -> KPolicy:
    """The KPolicy a SPEC string names; InputError naming the SPEC on any problem."""
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise InputError(f"k_max must be an integer >= 0, got {k_max!r}")
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise InputError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    name, sep, argument = spec.strip().partition(":")
    name = name.strip().lower()
    builder = POLICY_BUILDERS.get(name)
    if builder is None:
        raise InputError(f"unknown policy {spec!r}; known: {', '.join(sorted(POLICY_BUILDERS))}")
    context = PolicyContext(profile=profile, k_max=k_max, max_num_seqs=max_num_seqs)
    return builder(argument if sep else None, context)
