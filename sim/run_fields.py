"""A run described by flat keyword fields (`RunConfig`'s own and the workload knobs of
`traces.registry.WorkloadOptions`), as the API and the CLI take them, made into a `RunConfig`.
One place for that mapping, so every command reads its fields the same way."""

from __future__ import annotations

import dataclasses
from typing import Any

from dsd.common.errors import InputError
from dsd.policies.plugin import policy_spec
from dsd.policies.speculative_config import (
    method_from_speculative_config,
    spec_from_speculative_config,
)
from dsd.sim.config import RunConfig
from dsd.traces.registry import WorkloadOptions

RUN_CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(RunConfig))
WORKLOAD_FIELDS = frozenset(field.name for field in dataclasses.fields(WorkloadOptions))


def run_config(*, speculative_config: str | None = None, **fields: Any) -> RunConfig:
    """The `RunConfig` that flat fields describe (RunConfig's own fields and the workload
    knobs of `WorkloadOptions`). `speculative_config` (a vLLM --speculative-config, inline JSON
    or a file) gives the policy and k_max instead of `policy`."""
    unknown = sorted(set(fields) - RUN_CONFIG_FIELDS - WORKLOAD_FIELDS)
    if unknown:
        raise InputError(f"unknown run field(s): {', '.join(unknown)}")
    if speculative_config is not None:
        if fields.get("policy") is not None:
            raise InputError("give exactly one of --policy and --speculative-config")
        fields["policy"], config_k_max = spec_from_speculative_config(speculative_config)
        if fields.get("k_max") not in (None, config_k_max):
            raise InputError(
                f"--num-spec-tokens {fields['k_max']} conflicts with the speculative config's "
                f"num_speculative_tokens {config_k_max}"
            )
        fields["k_max"] = config_k_max
        config_method = method_from_speculative_config(speculative_config)
        if config_method is not None:
            if fields.get("speculative_method") not in (None, config_method):
                raise InputError(
                    f"--speculative-method {fields['speculative_method']} conflicts with the "
                    f"speculative config's method ({config_method})"
                )
            fields["speculative_method"] = config_method
    if fields.get("speculative_method") is None:
        fields.pop("speculative_method", None)  # RunConfig's default: ngram
    if fields.get("policy") is None:
        raise InputError("give exactly one of --policy and --speculative-config")
    fields["policy"] = policy_spec(fields["policy"])  # a user's policy object or file
    options = WorkloadOptions(**{k: v for k, v in fields.items() if k in WORKLOAD_FIELDS})
    own = {k: v for k, v in fields.items() if k in RUN_CONFIG_FIELDS and k not in WORKLOAD_FIELDS}
    return RunConfig(**options.arguments(), **own)
