"""EAGLE-style drafting: a small head runs autoregressively on the base's own features (`heads/eagle.py`).

Each proposal first feeds the head every position committed since its last proposal, with the base's REAL final
hidden states (`DraftContext.hidden_states`), then drafts k tokens one at a time on its own predicted features.
The head keeps its own KV cache; like the main cache it holds one entry per position and is rolled back by length:
entries written while drafting are cut before the next proposal, which rewrites those positions from real features.
Greedy drafts are argmax point masses; sampled drafts carry their draft_probs (zero outside the draft vocabulary)
to the exact verifier.
"""
from __future__ import annotations

import torch

from selfspec.drafters.base import Draft, DraftContext, draw_draft, load_extra_module
from selfspec.sampling import top_probability


class EagleDrafter:
    """head: an `EagleHead` or its directory. min_draft_confidence: stop drafting when the draft distribution's top
    probability falls below this (0 = never)."""

    def __init__(self, target, head, min_draft_confidence: float = 0.0):
        from heads.eagle import EagleHead

        if head is None:
            raise ValueError("drafter='eagle' needs heads=EagleHead or its directory; train one with "
                             "`python -m training.heads --kind eagle`")
        head = load_extra_module(head, target.model, EagleHead, "the EAGLE head")
        if not 0.0 <= min_draft_confidence <= 1.0:
            raise ValueError(f"min_draft_confidence must be in [0, 1], got {min_draft_confidence!r}")
        self.head = head.eval()
        self.min_draft_confidence = min_draft_confidence
        self.embed = target.model.get_input_embeddings()
        self.draft_vocab = head.draft_vocab  # [N] ids or None (full vocabulary)
        self._cache = None
        self._real_length = 0  # head cache entries computed from the base's real features

    @property
    def extra_modules(self) -> tuple:
        return (self.head,)

    def propose(self, context: DraftContext) -> Draft:
        new_features = context.hidden_states  # [num_new, hidden] real features of the newly committed positions
        num_tokens, num_new = context.token_ids.shape[0], new_features.shape[0]
        first = num_tokens - 1 - num_new  # position of new_features[0]; it predicts token_ids[first + 1]
        if first == 0 or self._cache is None:  # a new sequence
            self._cache, self._real_length = self.head.new_cache(), 0
        if first != self._real_length:
            raise RuntimeError(
                f"the EAGLE drafter saw positions up to {self._real_length} but the next new feature is at {first}: "
                "every committed position's hidden state must reach it (DraftContext.hidden_states)"
            )
        _crop(self._cache, self._real_length)  # drop the entries the previous proposal drafted on predicted features
        positions = torch.arange(first, num_tokens - 1, device=new_features.device)
        features = self.head(new_features[None], self.embed(context.token_ids[first + 1 :])[None], positions[None], self._cache)
        self._real_length = num_tokens - 1
        feature = features[0, -1:]  # [1, hidden] predicted feature of the pending token's position
        tokens, draft_probs = [], []
        for step in range(context.num_draft_tokens):
            logits = context.target.logits(feature, vocab_ids=self.draft_vocab)  # [1, N]
            token, probs = draw_draft(logits, context, self.draft_vocab)  # [1] model ids, [1, vocab] or None
            # Drawn before the confidence check, which only decides how many drafts are proposed, never which.
            if self.min_draft_confidence and float(top_probability(logits, probs)) < self.min_draft_confidence:
                break
            tokens.append(token)
            if probs is not None:
                draft_probs.append(probs)
            if step + 1 < context.num_draft_tokens:
                position = torch.full((1, 1), num_tokens - 1 + step, device=token.device)
                feature = self.head(feature[None], self.embed(token)[None], position, self._cache)[0]
        if not tokens:
            return Draft.empty(context.token_ids.device)
        return Draft(torch.cat(tokens), torch.cat(draft_probs) if draft_probs else None)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass


def _crop(cache, length: int) -> None:
    for layer in cache.layers:
        excess = layer.get_seq_length() - length
        if excess > 0:
            layer.crop(-excess)
