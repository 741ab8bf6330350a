"""`dsd policy explain`: what a batch-level policy does at every B under a profile (K, AL, ITL,
goodput, the best K), and the range table it compiles to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsd.policies.plugin import policy_spec
from dsd.policies.profile_io import load_profile
from dsd.policies.range_table import RangeTable, compile_range_table, evaluate_policy
from dsd.policies.spec import parse_policy
from dsd.sim.models.latency_choice import held_out_summary

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class PolicyExplanation:
    """What a batch-level policy does at every B under a profile."""

    frame: pd.DataFrame  # one row per B: B, K, AL, ITL ms, goodput tok/s/req, best K, note
    range_table: RangeTable  # the policy compiled to vLLM's range table
    k_max: int  # the profile's K_max
    # each latency model's worst error at a profiled B it was fitted without ("" below 3 B)
    held_out: str = ""


def explain_policy(
    profile: str | Path,
    *,
    max_num_seqs: int,
    policy: str | object = "goodput",
    show_all: bool = False,
) -> PolicyExplanation:
    """B -> K, AL, ITL and goodput of a policy; without `show_all`, the rows where K changes,
    the profiled B, B = 1 and the last B."""
    loaded = load_profile(profile)
    chosen = parse_policy(
        policy_spec(policy), profile=loaded, k_max=loaded.k_max, max_num_seqs=max_num_seqs
    )
    evaluated = evaluate_policy(chosen, loaded, max_num_seqs)
    profiled = set(loaded.batch_sizes())
    changes = np.concatenate([[False], evaluated.k_star[1:] != evaluated.k_star[:-1]])  # [N]
    import pandas as pd

    frame = pd.DataFrame(
        {
            "B": evaluated.batch_sizes,
            "K": evaluated.k_star,
            "AL": evaluated.acceptance_length,
            "ITL ms": evaluated.itl_ms,
            "goodput tok/s/req": evaluated.goodput * 1000.0,
            "best K": np.argmax(evaluated.goodput_by_k, axis=1),
            "note": [
                ", ".join(
                    note
                    for note, present in (("profiled", b in profiled), ("K changes", change))
                    if present
                )
                for b, change in zip(evaluated.batch_sizes.tolist(), changes.tolist(), strict=True)
            ],
        }
    )
    if not show_all:
        batch = frame["B"]
        keep = (batch == 1) | (batch == batch.iloc[-1]) | batch.isin(profiled) | changes
        frame = frame[keep].reset_index(drop=True)
    return PolicyExplanation(
        frame=frame,
        range_table=compile_range_table(chosen, loaded.k_max, max_num_seqs),
        k_max=loaded.k_max,
        held_out=held_out_summary(loaded),
    )
