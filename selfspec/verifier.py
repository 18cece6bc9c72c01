"""The exact verifier: accept or reject a chain of draft tokens against the target's distributions.

Pure functions over tensors: no model, no cache, no I/O. Words as in vLLM: a draft token is *accepted*; the
token sampled at the first rejection is *recovered*; the token after a fully accepted chain is the *bonus*.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from selfspec.sampling import SamplingConfig, WarpedRows, greedy_tokens, keyed_tokens, sample_from
from selfspec.seeded import PositionNoise


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # leading draft tokens kept, 0..num_draft_tokens
    next_token: int  # recovered token (a rejection happened) or bonus token (all accepted)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Greedy decoding: keep drafts while they equal the target's argmax; the next token is the argmax after them.

    draft_tokens: [num_draft_tokens]; target_logits: [num_draft_tokens + 1, vocab] (row i scores position i).
    """
    return accept_greedy(draft_tokens.tolist(), greedy_tokens(target_logits).tolist())


def accept_greedy(draft_tokens: list[int], target_tokens: list[int]) -> Verdict:
    """`verify_greedy` on the target's argmax already taken: target_tokens[i] is its argmax at position i
    (num_draft_tokens + 1 of them). The batched form, on the device: `verdicts.chain_verdicts`."""
    num_accepted = 0
    for draft_token, target_token in zip(draft_tokens, target_tokens):
        if draft_token != target_token:
            break
        num_accepted += 1
    return Verdict(num_accepted, target_tokens[num_accepted])


def verify_keyed(draft_tokens: torch.Tensor, target_logits: torch.Tensor, sampling: SamplingConfig,
                 noise: PositionNoise, first_position: int) -> Verdict:
    """Sampling with a seed (`selfspec/seeded.py`): the target's token at each position is its keyed draw there; keep
    drafts while they equal it, the next token is the draw after them. Row i of target_logits [num_draft_tokens + 1,
    vocab] decides sequence position first_position + i; rows after the first mismatch are never warped. The tokens
    are plain keyed sampling's whatever was drafted, so their law is the target's."""
    draft_list = draft_tokens.tolist()
    for i in range(len(draft_list) + 1):
        target_token = int(keyed_tokens(target_logits[i], sampling, noise, first_position + i)[0])
        if i == len(draft_list) or draft_list[i] != target_token:
            return Verdict(i, target_token)
    raise AssertionError("unreachable")


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor | WarpedRows,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the output has exactly the target's law.

    draft_tokens: [num_draft_tokens], draft token i was sampled from draft_probs[i].
    draft_probs:  [num_draft_tokens, vocab], or None when every draft is a point mass (n-gram, argmax heads).
    target_probs: [num_draft_tokens + 1, vocab], already warped exactly as the draft side was; float32 or wider. A
    `WarpedRows` warps each row when it is first read, so rows after the first rejection are never computed.

    Accept draft i with probability min(1, target/draft); at the first rejection sample the recovered token from
    norm(max(0, target - draft)) and stop; if all are accepted sample the bonus token from the last target row.
    """
    num_draft_tokens = draft_tokens.shape[0]
    # One uniform per draft, drawn up front whether or not it is reached (the generator's use does not depend on
    # how many drafts are accepted).
    uniform = torch.rand(num_draft_tokens, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    for i, token in enumerate(draft_tokens.tolist()):
        target_row = target_probs[i]  # [vocab]
        draft_of_draft = 1.0 if draft_probs is None else draft_probs[i, token].to(target_row.dtype)
        # u < p/q written without the division; p == 0 never accepts, p >= q always does.
        if not uniform[i] * draft_of_draft < target_row[token]:
            return Verdict(i, int(sample_from(_residual(target_row, draft_probs, i, token), generator)))
    return Verdict(num_draft_tokens, int(sample_from(target_probs[num_draft_tokens], generator)))


def probe_accepted(draft_token: int, draft_prob: float, target_row: torch.Tensor, uniform: float) -> bool:
    """Whether the sampled verifier would accept one draft token, without verifying it: u < p / q, as
    `verify_sampled` decides its first draft (here with `uniform` given, not drawn from the user's generator).

    draft_prob: the draft's probability of its token (1.0 for a point mass); target_row: [vocab] the target's warped
    probabilities at the draft's position. A probe scored in shadow (`verify_step.verify_in_shadow`) is thus accepted
    with exactly the probability min(1, p / q) the real verifier would accept it with."""
    return uniform * draft_prob < float(target_row[draft_token])


def _residual(target_row: torch.Tensor, draft_probs: torch.Tensor | None, row: int, token: int) -> torch.Tensor:
    """norm(max(0, target - draft)) after draft `row` (token `token`) was rejected."""
    if draft_probs is None:
        draft_row = torch.zeros_like(target_row)
        draft_row[token] = 1.0
    else:
        draft_row = draft_probs[row].to(target_row.dtype)
    return normalised_or((target_row - draft_row).clamp_min(0.0), target_row)


def normalised_or(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """residual / its mass, the law after a rejection; `fallback` (the target's law) when rounding left no mass.

    A rejection has probability sum(max(0, draft - target)) = sum(residual), so in exact arithmetic a rejection
    implies residual mass > 0. Rounding can leave ~0 mass when draft == target; then the target is the law. Shared
    with the tree verifier's sibling rules."""
    mass = residual.sum()
    if float(mass) <= torch.finfo(residual.dtype).tiny:
        return fallback
    return residual / mass
