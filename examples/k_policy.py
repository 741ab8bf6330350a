"""K policies of one's own, outside the dsd package: dsd runs them by `FILE.py:ClassName`.

`BatchCutoff` drafts k_max tokens below a batch-size cutoff and fewer above it; it depends on
the batch size alone (BATCH_SIZE_ONLY), so it also exports to vLLM's range table.
`EpsilonGreedy` learns, per drafted K, the output tokens per second its rows got, and mostly
picks the best K, each decode row on its own; its exploration draws from the run's seed stream,
so a run is as reproducible as with dsd's own policies.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CutoffConfig:
    cutoff: int = 8  # B at and above which K drops
    k_above: int = 1  # K there (at most k_max)


class BatchCutoff:
    BATCH_SIZE_ONLY = True  # K = f(B, k_max), and observe learns nothing
    Config = CutoffConfig  # `:cutoff=16,k_above=0` in the SPEC fills it

    def __init__(self, config: CutoffConfig = CutoffConfig()):
        self.config = config

    def choose_k(self, view):
        if view.batch_size < self.config.cutoff:
            return view.k_max
        return min(self.config.k_above, view.k_max)

    def observe(self, feedback):
        pass


class EpsilonGreedy:
    def __init__(self, k_max, seed, epsilon=0.1):
        self.rng = np.random.default_rng(seed)  # seed: the run's policy SeedSequence
        self.epsilon = epsilon
        self.tokens_per_s = np.zeros(k_max + 1)  # summed over rows, per drafted K
        self.rows = np.zeros(k_max + 1)

    def choose_k(self, view):
        mean = self.tokens_per_s / np.maximum(self.rows, 1)
        best = int(np.argmax(np.where(self.rows > 0, mean, np.inf)))  # untried K first
        explore = self.rng.random(view.num_decode_reqs) < self.epsilon
        drawn = self.rng.integers(0, view.k_max + 1, view.num_decode_reqs)
        return np.where(explore, drawn, min(best, view.k_max))

    def observe(self, feedback):
        tokens_per_s = (feedback.num_accepted + 1) / feedback.duration_s  # one per decode row
        np.add.at(self.tokens_per_s, feedback.num_spec_tokens, tokens_per_s)
        np.add.at(self.rows, feedback.num_spec_tokens, 1)
