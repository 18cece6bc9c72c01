"""A draft vocabulary: the N token ids a drafting head may propose (frequency-ranked over the base's own outputs, as
in FR-Spec / EAGLE-3), and the LM-head projection restricted to them.

Projecting a draft onto N of V rows costs N/V of a full LM-head projection (SmolLM2: 8k of 49k rows, 6x cheaper).
The verifier stays exact: a draft distribution is zero outside the draft vocabulary, and whatever mass the target
puts there comes back through the residual. Knows tensors only.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch


def most_frequent(token_ids: Iterable[torch.Tensor], vocab_size: int, size: int) -> torch.Tensor:
    """[size] ids, most frequent first, counted over the given id tensors (ties: lower id first)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in token_ids:
        counts += torch.bincount(ids.reshape(-1).long(), minlength=vocab_size)[:vocab_size]
    size = min(size, vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:size].clone()


def coverage(draft_vocab: torch.Tensor, token_ids: torch.Tensor) -> float:
    """Fraction of `token_ids` inside the draft vocabulary (how often a perfect head could be right at all)."""
    inside = torch.isin(token_ids.reshape(-1), draft_vocab.to(token_ids.device))
    return float(inside.float().mean()) if inside.numel() else 0.0


def full_vocab_probs(draft_vocab_probs: torch.Tensor, draft_vocab: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[..., N] probabilities over the draft vocabulary -> [..., vocab_size] with zeros outside it."""
    if draft_vocab is None:
        return draft_vocab_probs
    full = draft_vocab_probs.new_zeros((*draft_vocab_probs.shape[:-1], vocab_size))
    return full.index_copy_(-1, draft_vocab, draft_vocab_probs)
