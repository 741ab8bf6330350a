"""Token sampling and the accept/reject rule of speculative decoding, vectorised and sync-free.

Vocabulary (policies.types): a step verifies K **draft** tokens per row; the leading drafts the
target agrees with are **accepted** (a of them); the row then emits a + 1 **output tokens**: the a
accepted drafts plus one more, the **recovered** token at the first rejected position or, when
all K were accepted, the **bonus** token from the target's distribution after the last draft.

Three rules:
- temperature 0 (greedy match): accept while draft == target argmax; the extra token is the
  target's argmax at position a. The output equals plain greedy decoding of the target.
- drawn (`drawn_accept`): a is given (drawn before the step from the simulator's acceptance
  model); the output is the first a drafts and the target's argmax at position a, meaningless
  tokens for a timing run whose acceptance a trained pair would have.
- temperature > 0 (lossless rejection sampling, Leviathan et al. / Chen et al.): accept draft d
  with probability min(1, p(d) / q(d)); at the first rejection sample the recovered token from
  norm(max(p - q, 0)); if all accepted, sample the bonus from p. Each output token is then
  distributed exactly as the target's p.

Rows carry their own K (`num_spec_tokens`); tensors are padded to the step's largest K and
positions >= a row's K count as never drafted. Nothing here calls `.item()`/`.tolist()` or
branches on tensor values, so it runs without a host sync. Randomness comes only from the
`torch.Generator` passed in. This module does not run models or know about KV caches.
"""

from __future__ import annotations

import torch

PLACEHOLDER_TOKEN_ID = -1  # output slots past a row's a + 1 emitted tokens


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in float32; temperature must be > 0."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for probabilities, got {temperature}")
    return torch.softmax(logits.float() / temperature, dim=-1)  # [..., V]


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [..., V] -> ids [...]; zero-probability tokens never come out.

    Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with probability p_i / sum(p),
    without a host sync (torch.multinomial would do the same per row but is slower on GPU).
    """
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)  # [..., V]
    return (probs / noise).argmax(dim=-1)  # [...]


def sample_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Next-token ids [...] from logits [..., V]: argmax at temperature 0, else a sample."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)  # [...]
    return sample_from_probs(probs_from_logits(logits, temperature), generator)


def _leading_accepted(accept: torch.Tensor) -> torch.Tensor:
    """Count of leading True per row of accept [B, K] -> [B] int64."""
    return torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)  # [B]


def _drafted_mask(num_spec_tokens: torch.Tensor, k_step: int) -> torch.Tensor:
    """[B, K] True where position j < the row's K (the row really drafted position j)."""
    positions = torch.arange(k_step, device=num_spec_tokens.device)  # [K]
    return positions[None, :] < num_spec_tokens[:, None]  # [B, K]


def greedy_accept(
    draft_token_ids: torch.Tensor,  # [B, K] int64 (padded past each row's K)
    target_logits: torch.Tensor,  # [B, K+1, V] target logits after last token and each draft
    num_spec_tokens: torch.Tensor,  # [B] int64 K per row, 0 <= K_row <= K
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy match -> (num_accepted [B], output_token_ids [B, K+1] padded with -1)."""
    k_step = draft_token_ids.shape[1]
    target_ids = target_logits.argmax(dim=-1)  # [B, K+1]
    # draft j is accepted iff it equals the target's argmax at the same position (and was drafted)
    accept = (draft_token_ids == target_ids[:, :k_step]) & _drafted_mask(num_spec_tokens, k_step)
    num_accepted = _leading_accepted(accept)  # [B]
    # Output = target argmax at positions 0..a: the accepted drafts (equal to it) + recovered/bonus.
    keep = torch.arange(k_step + 1, device=target_ids.device)[None, :] <= num_accepted[:, None]
    output = torch.where(keep, target_ids, PLACEHOLDER_TOKEN_ID)  # [B, K+1]
    return num_accepted, output


def drawn_accept(
    draft_token_ids: torch.Tensor,  # [B, K] int64 (padded past each row's K)
    target_logits: torch.Tensor,  # [B, K+1, V] target logits after last token and each draft
    num_accepted: torch.Tensor,  # [B] int64 accepted counts drawn before the step, a <= K_row
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drawn acceptance (`backend.engine`, docs/validation.md) -> (num_accepted [B],
    output_token_ids [B, K+1] padded with -1): the a drafts the row was given as accepted, then
    the target's argmax at position a. The count does not depend on the logits, so the tokens
    mean nothing; the argmax over every position is the device work greedy matching does."""
    k_step = draft_token_ids.shape[1]
    target_ids = target_logits.argmax(dim=-1)  # [B, K+1]
    extra = target_ids.gather(1, num_accepted[:, None])[:, 0]  # [B]
    positions = torch.arange(k_step + 1, device=draft_token_ids.device)[None, :]  # [1, K+1]
    drafts_padded = torch.cat((draft_token_ids, extra[:, None]), dim=1)  # [B, K+1]
    output = torch.where(positions < num_accepted[:, None], drafts_padded, PLACEHOLDER_TOKEN_ID)
    output = torch.where(positions == num_accepted[:, None], extra[:, None], output)
    return num_accepted, output


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [B, K] int64, d_j ~ q_j (padded past each row's K)
    draft_probs: torch.Tensor,  # [B, K, V] q_j the draft sampled d_j from
    target_probs: torch.Tensor,  # [B, K+1, V] p_j at the same positions, plus the bonus position
    num_spec_tokens: torch.Tensor,  # [B] int64 K per row
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless rejection sampling -> (num_accepted [B], output_token_ids [B, K+1], -1 padded)."""
    batch, k_step = draft_token_ids.shape
    device = draft_token_ids.device
    draft_index = draft_token_ids[:, :, None]  # [B, K, 1]
    p_of_draft = target_probs[:, :k_step].gather(2, draft_index).squeeze(2)  # [B, K] p_j(d_j)
    q_of_draft = draft_probs.gather(2, draft_index).squeeze(2)  # [B, K] q_j(d_j) > 0
    uniform = torch.rand((batch, k_step), generator=generator, device=device)  # [B, K]
    # accept with prob min(1, p/q): u < p/q  <=>  u * q < p  (q >= p: always accept as u < 1)
    accept = (uniform * q_of_draft < p_of_draft) & _drafted_mask(num_spec_tokens, k_step)
    num_accepted = _leading_accepted(accept)  # [B]

    # Distribution of the extra token at position a: recovered norm(max(p - q, 0)) if a < K_row,
    # else the bonus p_a. Only row a is needed, so gather it before sampling.
    rows = torch.arange(batch, device=device)  # [B]
    p_at = target_probs[rows, num_accepted]  # [B, V]
    q_padded = torch.cat((draft_probs, torch.zeros_like(p_at)[:, None]), dim=1)  # [B, K+1, V]
    q_at = q_padded[rows, num_accepted]  # [B, V]; zero at the bonus position
    residual = torch.clamp(p_at - q_at, min=0.0)  # [B, V]
    residual_mass = residual.sum(dim=1, keepdim=True)  # [B, 1]
    is_recovered = (num_accepted < num_spec_tokens)[:, None]  # [B, 1]
    # rejected: resample from max(p - q, 0) (normalising is implicit in the sampler); all accepted:
    # bonus from p. residual_mass == 0 means p <= q everywhere, i.e. p == q, where rejection has
    # probability 0; fall back to p so the expression stays defined.
    extra_dist = torch.where(is_recovered & (residual_mass > 0), residual, p_at)  # [B, V]
    extra_token = sample_from_probs(extra_dist, generator)  # [B]

    positions = torch.arange(k_step + 1, device=device)[None, :]  # [1, K+1]
    drafts_padded = torch.cat((draft_token_ids, extra_token[:, None]), dim=1)  # [B, K+1]
    output = torch.where(positions < num_accepted[:, None], drafts_padded, PLACEHOLDER_TOKEN_ID)
    output = torch.where(positions == num_accepted[:, None], extra_token[:, None], output)
    return num_accepted, output  # [B], [B, K+1]
