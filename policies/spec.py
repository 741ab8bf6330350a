"""Policy SPEC strings -> KPolicy objects, through a plain registry dict.

A SPEC is `NAME[:ARGUMENT]`. A built-in NAME (`static`, `table`, `goodput`, `online`,
`per-request`, `context`, `hysteresis`, `bandit`, `envelope`) has a builder in
`POLICY_BUILDERS`; any other SPEC names a user's policy (`path/to/file.py:ClassName`,
`package.module:ClassName`, or an entry point of the group `dsd.policies`), which
`policies.plugin` loads and checks and which takes the same path from there on. Each SPEC's
grammar and keys: docs/policies.md.

This module only parses; the policies' semantics live in their own modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsd.common.errors import InputError, require_int
from dsd.common.user_paths import check_input_file
from dsd.policies.bandit import (
    BanditConfig,
    BanditPolicy,
)
from dsd.policies.bandit_arms import (
    ArmsBanditConfig,
    ArmsBanditPolicy,
    profile_prior_rewards,
)
from dsd.policies.context_aware import (
    ContextGoodputPolicy,
    ContextLatencyFn,
    ContextLatencyGrid,
    ContextRangeTablePolicy,
    read_context_ranges,
)
from dsd.policies.envelope import EnvelopePolicy, StaticSweep
from dsd.policies.goodput import GoodputConfig, GoodputPolicy
from dsd.policies.online import OnlineAcceptancePolicy, OnlineConfig
from dsd.policies.per_request import PerRequestConfig, PerRequestPolicy
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.policies.range_table import RangeTablePolicy, read_ranges
from dsd.policies.static import StaticPolicy
from dsd.policies.switching import HysteresisConfig, HysteresisPolicy
from dsd.policies.types import MAX_NUM_SEQS, MAX_SPEC_TOKENS, KPolicy


@dataclass(frozen=True)
class PolicyContext:
    """What a builder may use besides its SPEC argument."""

    profile: Profile | None  # the loaded profile, if the command has one
    k_max: int  # num_speculative_tokens of the engine, >= 0
    max_num_seqs: int  # largest B the engine schedules, >= 1
    # Seed for policies that sample (bandit); from the run's SeedSequence. None: SPEC or 0.
    seed: int | np.random.SeedSequence | None = None
    # ITL(B, K [n], total context tokens) ms for `context`, e.g. the sim's fitted model.
    context_latency: ContextLatencyFn | None = None


PolicyBuilder = Callable[[str | None, PolicyContext], KPolicy]


def _needs_profile(name: str, context: PolicyContext) -> Profile:
    if context.profile is None:
        raise InputError(f"policy {name!r} needs a profile (--profile)")
    return context.profile


def _build_static(argument: str | None, context: PolicyContext) -> KPolicy:
    if argument is None:  # vLLM's plain num_speculative_tokens: K = k_max every step
        return StaticPolicy(context.k_max)
    # ASCII digits only: str.isdigit() also accepts '²', which int() refuses.
    if not (argument.strip().isascii() and argument.strip().isdigit()):
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
    config = GoodputConfig(**parse_keys("goodput", argument, GoodputConfig))
    return GoodputPolicy(_needs_profile("goodput", context), context.max_num_seqs, config=config)


def parse_keys(
    name: str, argument: str | None, config_type: type[Any], extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`key=value,...` into typed values for the fields of `config_type` (plus `extra` ints)."""
    if not argument:
        return {}
    defaults = config_type()
    fields = {f.name for f in dataclasses.fields(config_type)} | set(extra)
    values: dict[str, Any] = {}
    for item in argument.split(","):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or key not in fields:
            raise InputError(
                f"policy {name!r}: expected key=value with key in {sorted(fields)}, got {item!r}"
            )
        default = getattr(defaults, key, 0)
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise InputError(f"policy {name!r}: {key} must be true or false, got {raw!r}")
            values[key] = raw.lower() in ("true", "1")
            continue
        try:
            if isinstance(default, str):
                values[key] = raw
            elif isinstance(default, int):
                values[key] = int(raw)
            else:
                values[key] = float(raw)
        except ValueError:
            kind = "an integer" if isinstance(default, int) else "a number"
            raise InputError(f"policy {name!r}: {key} must be {kind}, got {raw!r}") from None
    return values


def _parse_online_config(argument: str | None) -> OnlineConfig:
    return OnlineConfig(**parse_keys("online", argument, OnlineConfig))


def _build_online(argument: str | None, context: PolicyContext) -> KPolicy:
    config = _parse_online_config(argument)
    return OnlineAcceptancePolicy(_needs_profile("online", context), context.max_num_seqs, config)


def _build_per_request(argument: str | None, context: PolicyContext) -> KPolicy:
    config = PerRequestConfig(**parse_keys("per-request", argument, PerRequestConfig))
    profile = _needs_profile("per-request", context)
    return PerRequestPolicy(profile, context.max_num_seqs, config)


def _build_context(argument: str | None, context: PolicyContext) -> KPolicy:
    if argument:
        key, sep, value = argument.partition("=")
        if key.strip() != "table" or not sep or not value.strip():
            raise InputError(
                f"policy 'context' takes table=JSON_OR_PATH or nothing, got context:{argument}"
            )
        return ContextRangeTablePolicy(
            read_context_ranges(value), context.k_max, context.max_num_seqs
        )
    profile = _needs_profile("context", context)
    latency = context.context_latency
    if latency is None:
        latency = ContextLatencyGrid.from_profile(profile)
    return ContextGoodputPolicy(
        latency,
        profile.acceptance_rates[: context.k_max],
        context.k_max,
        draft_rates=profile.draft_rates,
    )


def split_hysteresis(argument: str) -> tuple[str, str | None]:
    """(BASE, options): the last `:` segment is options when all its keys are ours."""
    base, sep, tail = argument.rpartition(":")
    ours = {f.name for f in dataclasses.fields(HysteresisConfig)}
    if sep and tail and all(item.partition("=")[0].strip() in ours for item in tail.split(",")):
        return base, tail
    return argument, None


def _build_hysteresis(argument: str | None, context: PolicyContext) -> KPolicy:
    if not argument:
        raise InputError("policy 'hysteresis' needs a base policy (hysteresis:BASE[:key=value])")
    base_spec, options = split_hysteresis(argument)
    base_name = policy_name(base_spec)
    if base_name in ("bandit", "per-request", "hysteresis"):
        raise InputError(
            f"policy 'hysteresis' wraps a batch-level policy with a pure choose_k, "
            f"not {base_name!r}"
        )
    base = _parse_with_context(base_spec, context)
    config = HysteresisConfig(**parse_keys("hysteresis", options, HysteresisConfig))
    return HysteresisPolicy(base, context.max_num_seqs, config)


def _build_bandit(argument: str | None, context: PolicyContext) -> KPolicy:
    # `model=linear` (default): the structured bandit; `model=arms`: independent arms per
    # bucket. `prior=profile` seeds either from the profile; `prior=none` (default) needs no
    # profile. The other keys are numeric and go through parse_keys against the model's config.
    items = [item for item in (argument or "").split(",") if item.strip()]
    words: dict[str, str] = {"prior": "none", "model": "linear"}
    for item in items:
        key = item.partition("=")[0].strip()
        if key in words:
            words[key] = item.partition("=")[2].strip()
    prior, model = words["prior"], words["model"]
    if not prior:
        raise InputError("policy 'bandit': prior must be none, profile or a profile file, got ''")
    if model not in ("linear", "arms"):
        raise InputError(f"policy 'bandit': model must be linear or arms, got {model!r}")
    argument = ",".join(item for item in items if item.partition("=")[0].strip() not in words)
    config_type = ArmsBanditConfig if model == "arms" else BanditConfig
    values = parse_keys("bandit", argument, config_type, extra=("seed",))
    seed_value = values.pop("seed", None)
    seed: int | np.random.SeedSequence
    if seed_value is not None:
        if seed_value < 0:
            raise InputError(f"policy 'bandit': seed must be >= 0, got {seed_value}")
        seed = int(seed_value)
    else:
        seed = context.seed if context.seed is not None else 0
    profile: Profile | None = None
    if prior == "profile":
        profile = _needs_profile("bandit:prior=profile", context)
    elif prior != "none":
        # A profile file: a measured one, or one a previous run learned (`learned_profile.json`
        # of `dsd simulate --out`), to start warm. Its K range need not match the run's.
        try:
            check_input_file(prior, "profile file")
        except InputError as error:
            raise InputError(
                f"policy 'bandit': prior must be none, profile or a profile file; {error}"
            ) from None
        profile = load_profile(prior)
    if model == "linear":
        return BanditPolicy(
            context.k_max,
            context.max_num_seqs,
            seed,
            BanditConfig(**values),
            profile=profile,
        )
    prior_rewards = None
    if profile is not None:
        prior_rewards = profile_prior_rewards(profile, context.k_max, context.max_num_seqs)
    return ArmsBanditPolicy(
        context.k_max,
        context.max_num_seqs,
        seed,
        ArmsBanditConfig(**values),
        prior_rewards=prior_rewards,
    )


def _build_envelope(argument: str | None, context: PolicyContext) -> KPolicy:
    if not argument:
        raise InputError("policy 'envelope' needs a static sweep JSON file (envelope:PATH)")
    return EnvelopePolicy(StaticSweep.read(argument.strip()), context.max_num_seqs)


POLICY_BUILDERS: dict[str, PolicyBuilder] = {
    "static": _build_static,
    "table": _build_table,
    "goodput": _build_goodput,
    "online": _build_online,
    "per-request": _build_per_request,
    "context": _build_context,
    "hysteresis": _build_hysteresis,
    "bandit": _build_bandit,
    "envelope": _build_envelope,
}


def parse_policy(
    spec: str,
    *,
    profile: Profile | None,
    k_max: int,
    max_num_seqs: int,
    seed: int | np.random.SeedSequence | None = None,
    context_latency: ContextLatencyFn | None = None,
) -> KPolicy:
    """The KPolicy a SPEC string names; InputError naming the SPEC on any problem.

    `seed` feeds policies that sample (bandit); `context_latency` feeds `context`.
    """
    require_int(k_max, "k_max", 0)
    require_int(max_num_seqs, "max_num_seqs", 1, MAX_NUM_SEQS)
    context = PolicyContext(
        profile=profile,
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        seed=seed,
        context_latency=context_latency,
    )
    return _parse_with_context(spec, context)


def spec_k_max(spec: str) -> int | None:
    """The k_max a SPEC fixes by itself, as vLLM's num_speculative_tokens comes with its
    config: `static:K` -> K, a range table (`table:`, `context:table=`) -> its largest K (at
    most MAX_SPEC_TOKENS, as a lookup clamps), `hysteresis:BASE` -> BASE's. None for the
    policies that choose K up to whatever k_max the run has, and for a SPEC that does not parse
    (its builder reports it). A static K above MAX_SPEC_TOKENS is that bound (the builder
    refuses the K)."""
    name, _sep, argument = spec.strip().partition(":")
    name, argument = name.strip().lower(), argument.strip()
    if name == "static":
        fixed = int(argument) if argument.isascii() and argument.isdigit() else None
        return None if fixed is None else min(fixed, MAX_SPEC_TOKENS)
    if name == "hysteresis" and argument:
        return spec_k_max(split_hysteresis(argument)[0])
    try:
        if name == "table" and argument:
            ks = [entry[2] for entry in read_ranges(argument)]
        elif name == "context" and argument.partition("=")[0].strip() == "table":
            ks = [entry[4] for entry in read_context_ranges(argument.partition("=")[2])]
        else:
            return None
    except InputError:
        return None
    return min(max(ks, default=0), MAX_SPEC_TOKENS)


def run_k_max(spec: str, base: int) -> int:
    """The k_max of a run of `spec` given none: `base` (the profile's k_max, or the default)
    raised to the K the SPEC fixes (`spec_k_max`), so `static:6` runs like vLLM with
    num_speculative_tokens 6. The one rule of `dsd simulate` (sim.resolve) and the exports."""
    return max(base, spec_k_max(spec) or 0)


def policy_source(spec: str) -> dict[str, Any] | None:
    """Where a user's policy's code came from (`spec`, `kind`, `path`, `class`, `sha256` of the
    file; `policies.plugin`), recorded beside results; None for a built-in policy."""
    from dsd.policies.plugin import policy_source as source

    return source(spec, POLICY_BUILDERS)


def policy_sources(specs: Iterable[str]) -> dict[str, Any]:
    """{"policy_sources": {SPEC: policy_source}} of the users' policies among `specs`, or {}
    when there are none (what a report's config records beside its SPEC list)."""
    sources = {spec: policy_source(spec) for spec in specs}
    found = {spec: source for spec, source in sources.items() if source is not None}
    return {"policy_sources": found} if found else {}


def policy_name(spec: str) -> str:
    """A SPEC's policy name, as parsing reads it: "per-request" for " Per-Request:decay=0.9"."""
    return spec.strip().partition(":")[0].strip().lower()


def _parse_with_context(spec: str, context: PolicyContext) -> KPolicy:
    _name, sep, argument = spec.strip().partition(":")
    name = policy_name(spec)
    builder = POLICY_BUILDERS.get(name)
    if builder is None:  # a user's policy (its own file, module or entry point)
        from dsd.policies.plugin import build_user_policy

        return build_user_policy(spec, context)
    return builder(argument if sep else None, context)


def split_policy_list(text: str) -> list[str]:
    """SPECs from a comma-separated list: commas inside [...] (inline tables) do not split, and
    a `key=value` piece without a `:` continues the SPEC before it
    (`online:warmup_steps=10,decay=0.99,static:3` is two SPECs). Empty or repeated SPECs are
    refused."""
    pieces: list[str] = []
    depth = 0
    current = ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            pieces.append(current.strip())
            current = ""
        else:
            current += char
    pieces.append(current.strip())
    specs: list[str] = []
    for piece in pieces:
        if specs and piece and "=" in piece and ":" not in piece:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    if any(not spec for spec in specs):
        raise InputError(f"--policies: empty SPEC in {text!r}")
    if len(set(specs)) != len(specs):
        raise InputError(f"--policies: duplicate SPEC in {text!r}")
    return specs
