"""Early-exit drafting for every row of a batch at once: one pass of the model's first layers per draft position.

The single-sequence `EarlyExitDrafter` (`drafters/early_exit.py`) per row, batched through the batch's own cache (the
rows' `RaggedCache`, handed over as `DraftContext.cache`). A proposal builds the block the batch then verifies,
[pending, *drafts] per row, one entry at a time: pass j runs entry j of every row through the first `exit_layer`
layers (the cache's mask and positions for that entry: each row sees its committed prefix and its own entries
0..j, at its own positions), which writes those layers' keys and values, and the rows still drafting draw their next
token from the exit state (each with its own context and generator, in the order it draws alone; its own
min_draft_confidence stop). A row's last draft passes once more, so its exit state exists for verification, unless
the row's one token is a probe scored in shadow (`DraftContext.probe`), as alone. Passes stop when no row needs
another, so the first layers hold 1 + the most drafts a verified row proposed entries per row: the very block the
batch verifies (a probe's row verifies its pending token alone).

Shared work, as alone: each draft carries `prefilled_layers` and its exit states (`prefilled_hidden`), so the batch's
verify forward runs only the remaining layers over the same block (`batch._forward_block`). With `share_work=False`
(the naive reference) the drafted entries are cut from the first layers and verification runs every layer.
Chains only (a batch refuses trees). Knows nothing about verification or stopping.
"""
from __future__ import annotations

import torch

from selfspec.drafters.base import Draft, DraftContext, confident_rows, draw_rows
from selfspec.drafters.early_exit import EarlyExitDrafter


class BatchEarlyExitDrafter:
    """Drafts for every row of one batch with the batch's `EarlyExitDrafter` (its exit layer, adapter, confidence
    floor and share_work). Row r of every call is row r of the batch's cache; it keeps nothing between proposals."""

    def __init__(self, target, drafter: EarlyExitDrafter):
        self.target, self.drafter = target, drafter

    @property
    def extra_modules(self) -> tuple:
        return self.drafter.extra_modules

    def propose(self, contexts: list[DraftContext]) -> list[Draft]:
        """One context per row of the batch's cache, in its order -> each row's draft of up to its num_draft_tokens,
        every row's [pending, *drafts] entries written to the first `exit_layer` layers (share_work)."""
        cache, target, exit_layer = contexts[0].cache, self.target, self.drafter.exit_layer
        limits = [context.num_draft_tokens for context in contexts]
        ids = torch.stack([context.token_ids[-1] for context in contexts])  # [B] entry j of each row's block
        tokens, draft_probs = [[] for _ in contexts], [[] for _ in contexts]
        exit_states = []  # per pass j: [B, hidden], entry j's exit state in every row
        drafting = [r for r, k in enumerate(limits) if k > 0]  # rows drawing a token from this pass's exit state
        while True:
            j = len(exit_states)
            exit_states.append(target.exit_forward_block(
                ids[:, None], cache.hf_cache, exit_layer, cache.block_mask(1, target.dtype, j),
                cache.block_positions(1, j))[:, 0])
            if not drafting:
                break
            rows = drafting
            logits = self.drafter.exit_logits(target, exit_states[-1][torch.tensor(rows, device=ids.device)])  # [D, V]
            drawn, probs = draw_rows(logits, [contexts[r] for r in rows], None, [len(tokens[r]) for r in rows])  # [D], [D, vocab] | None
            confident = confident_rows(logits, probs, self.drafter.min_draft_confidence)
            drafting, last_pass = [], False
            for i, r in enumerate(rows):
                if not confident[i]:  # drawn before the check, as alone: it decides how many drafts, never which
                    continue
                tokens[r].append(drawn[i : i + 1])
                if probs is not None:
                    draft_probs[r].append(probs[i : i + 1])
                ids[r] = drawn[i]
                if len(tokens[r]) < limits[r]:
                    drafting.append(r)
                else:  # the last draft's own pass gives its exit state for verification (not for a probe scored in
                    # shadow, nor for the naive reference, whose verification runs every layer)
                    last_pass = last_pass or (self.drafter.share_work and not contexts[r].probe)
            if not drafting and not last_pass:
                break
        states = torch.stack(exit_states, dim=1)  # [B, passes, hidden]
        drafts = [(torch.cat(t) if t else ids.new_empty(0), torch.cat(p) if p else None)
                  for t, p in zip(tokens, draft_probs)]
        if not self.drafter.share_work:  # the naive reference: verification redoes the first layers
            cache.rollback(cache.lengths)  # (the drafted entries were never committed: cut back to the rows' lengths)
            return [Draft(t, p) for t, p in drafts]
        return [Draft(t, p, prefilled_layers=exit_layer, prefilled_hidden=states[r, : t.shape[0] + 1])
                for r, (t, p) in enumerate(drafts)]

    def select(self, rows: torch.Tensor) -> None:
        """Rows leave with the batch's cache, which the batch selects; nothing is kept here."""

    def join(self, num_rows: int) -> None:
        """Rows join with the batch's cache, which the batch joins; nothing is kept here."""

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass
