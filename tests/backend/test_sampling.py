"""Greedy match and lossless rejection sampling: exact cases and distribution checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dsd.backend.sampling import (
    PLACEHOLDER_TOKEN_ID,
    greedy_accept,
    rejection_sample,
    sample_from_probs,
    sample_tokens,
)


def chisquare_pvalue(counts: np.ndarray, probs: np.ndarray | torch.Tensor) -> float:
    """Goodness of fit of counts to probs (renormalised in float64 so the sums agree)."""
    expected = np.asarray(probs, dtype=np.float64)
    expected = expected / expected.sum() * counts.sum()
    return float(stats.chisquare(counts, expected).pvalue)


def one_hot_logits(token_ids: list[list[int]], vocab: int = 8) -> torch.Tensor:
    ids = torch.tensor(token_ids)  # [B, K+1]
    return torch.nn.functional.one_hot(ids, vocab).float() * 5.0  # [B, K+1, V]


# (draft ids, target argmax ids, K per row, expected accepted, expected output)
GREEDY_CASES = [
    # all 3 drafts match: bonus token 4 after them
    ([[1, 2, 3]], [[1, 2, 3, 4]], [3], [3], [[1, 2, 3, 4]]),
    # first draft wrong: recovered token is the target's 5, nothing else
    ([[1, 2, 3]], [[5, 2, 3, 4]], [3], [0], [[5, -1, -1, -1]]),
    # mismatch in the middle: accepted 1, recovered 6; the later match at pos 2 does not count
    ([[1, 2, 3]], [[1, 6, 3, 4]], [3], [1], [[1, 6, -1, -1]]),
    # row K=1 of a K=3 step: padded drafts are never accepted even if they match; bonus at 1
    ([[1, 2, 3]], [[1, 2, 3, 4]], [1], [1], [[1, 2, -1, -1]]),
    # K=0 row: plain decoding, emits the target's argmax
    ([[1, 2, 3]], [[7, 2, 3, 4]], [0], [0], [[7, -1, -1, -1]]),
    # two rows with different K in one step
    ([[1, 2], [3, 3]], [[1, 2, 0], [3, 1, 0]], [2, 2], [2, 1], [[1, 2, 0], [3, 1, -1]]),
]


@pytest.mark.parametrize(("draft", "target", "ks", "accepted", "output"), GREEDY_CASES)
def test_greedy_accept_cases(draft, target, ks, accepted, output) -> None:
    num_accepted, out = greedy_accept(torch.tensor(draft), one_hot_logits(target), torch.tensor(ks))
    assert num_accepted.tolist() == accepted
    assert out.tolist() == output


def _fixed_distributions(vocab: int, k_step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.7), size=k_step + 1)  # [K+1, V]
    q = rng.dirichlet(np.full(vocab, 0.7), size=k_step)  # [K, V]
    q[0, 0] = 0.0  # a token the draft never proposes but the target may emit
    q[0] /= q[0].sum()
    return torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)


def test_rejection_sampling_reproduces_target_distribution() -> None:
    vocab, k_step, num_rows = 6, 3, 200_000
    p, q = _fixed_distributions(vocab, k_step, seed=0)
    generator = torch.Generator().manual_seed(1234)
    draft_ids = sample_from_probs(q.expand(num_rows, k_step, vocab), generator)  # [N, K]
    num_accepted, out = rejection_sample(
        draft_ids,
        q.expand(num_rows, k_step, vocab),
        p.expand(num_rows, k_step + 1, vocab),
        torch.full((num_rows,), k_step),
        generator,
    )
    # p does not depend on earlier tokens here, so every emitted output token at position j has
    # marginal p_j. Chi-square goodness of fit; the seed is fixed, so this is deterministic.
    for position in range(k_step + 1):
        emitted = out[num_accepted >= position, position]
        counts = torch.bincount(emitted, minlength=vocab).numpy()
        assert chisquare_pvalue(counts, p[position].numpy()) > 1e-3, position
        tv = 0.5 * np.abs(counts / counts.sum() - p[position].numpy()).sum()
        assert tv < 0.01
    # Acceptance of the first draft happens with probability sum(min(p, q)).
    alpha = torch.minimum(p[0], q[0]).sum().item()
    assert abs((num_accepted >= 1).float().mean().item() - alpha) < 0.005


def test_rejection_sampling_with_draft_equal_target_accepts_everything() -> None:
    vocab, k_step, num_rows = 5, 4, 2000
    p, _ = _fixed_distributions(vocab, k_step, seed=3)
    generator = torch.Generator().manual_seed(0)
    draft_ids = sample_from_probs(p[:k_step].expand(num_rows, k_step, vocab), generator)
    num_accepted, out = rejection_sample(
        draft_ids,
        p[:k_step].expand(num_rows, k_step, vocab),
        p.expand(num_rows, k_step + 1, vocab),
        torch.full((num_rows,), k_step),
        generator,
    )
    # p/q == 1: always accept, and the drafts come out unchanged with a bonus token after them
    assert bool((num_accepted == k_step).all())
    assert torch.equal(out[:, :k_step], draft_ids)


def test_rejection_sampling_respects_per_row_k() -> None:
    vocab, k_step, num_rows = 5, 3, 3000
    p, _ = _fixed_distributions(vocab, k_step, seed=4)
    generator = torch.Generator().manual_seed(0)
    ks = torch.arange(num_rows) % (k_step + 1)  # rows cycle through K = 0, 1, 2, 3
    draft_ids = sample_from_probs(p[:k_step].expand(num_rows, k_step, vocab), generator)
    num_accepted, out = rejection_sample(
        draft_ids,
        p[:k_step].expand(num_rows, k_step, vocab),  # q == p: every drafted position is accepted
        p.expand(num_rows, k_step + 1, vocab),
        ks,
        generator,
    )
    assert torch.equal(num_accepted, ks)  # capped at each row's own K
    emitted_len = (out != PLACEHOLDER_TOKEN_ID).sum(dim=1)
    assert torch.equal(emitted_len, ks + 1)
    # The bonus of a K=0 row follows p_0.
    bonus = out[ks == 0, 0]
    counts = torch.bincount(bonus, minlength=vocab).numpy()
    assert chisquare_pvalue(counts, p[0].numpy()) > 1e-3


def test_rejection_sampling_is_seed_reproducible() -> None:
    vocab, k_step, num_rows = 7, 2, 500
    p, q = _fixed_distributions(vocab, k_step, seed=5)

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        drafts = sample_from_probs(q.expand(num_rows, k_step, vocab), generator)
        return rejection_sample(
            drafts,
            q.expand(num_rows, k_step, vocab),
            p.expand(num_rows, k_step + 1, vocab),
            torch.full((num_rows,), k_step),
            generator,
        )

    first, second, other = run(9), run(9), run(10)
    assert torch.equal(first[1], second[1]) and torch.equal(first[0], second[0])
    assert not torch.equal(first[1], other[1])


def test_sample_from_probs_matches_probs_and_skips_zero_mass() -> None:
    probs = torch.tensor([0.5, 0.0, 0.2, 0.3])
    generator = torch.Generator().manual_seed(2)
    draws = sample_from_probs(probs.expand(100_000, 4), generator)
    counts = torch.bincount(draws, minlength=4).numpy()
    assert counts[1] == 0
    assert chisquare_pvalue(counts[[0, 2, 3]], np.array([0.5, 0.2, 0.3])) > 1e-3


def test_sample_tokens_at_temperature_zero_is_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 1.0, 0.0]])
    assert sample_tokens(logits, 0.0, None).tolist() == [1, 0]
