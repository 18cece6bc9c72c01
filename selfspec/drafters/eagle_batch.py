"""EAGLE drafting for every row of a batch at once: one head forward per draft position serves all rows.

The single-sequence `EagleDrafter` (`drafters/eagle.py`) per row, batched: the rows share the one `EagleHead` and one
ragged head cache (`RaggedCache`, left-aligned rows, built from the head's layer config), whose committed length per
row is the row's real length (positions read from the base's real features). A proposal
  1. catches every row up on its newly committed positions in ONE padded head forward (the cache's mask and positions
     keep each row to its own entries, at its own positions), committed: the new real length;
  2. then per draft position: the logits of every row still drafting in one `target.logits` call, each row's token
     drawn with its own context (its own generator, in the order it draws alone: what keeps a seeded row equal to its
     prompt alone), its own min_draft_confidence stop, and one [B, 1] head forward feeding the drafted tokens back for
     the rows that draft further (the others' entries are not committed);
  3. rolls every row back to its real length: the entries drafted on predicted features are gone before the next
     proposal, which rewrites those positions from real features.
Rows asked for no drafts (k = 0) still catch up in step 1; a row's entries are the same whenever it catches up.
Chains only (a batch refuses trees). Knows nothing about verification, the target's cache or stopping.
"""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from selfspec.batch.cache import RaggedCache
from selfspec.drafters.base import Draft, DraftContext, confident_rows, draw_rows
from selfspec.drafters.eagle import EagleDrafter


class BatchEagleDrafter:
    """Drafts for the `num_rows` rows of one batch with the batch's `EagleDrafter` (its head, confidence floor and
    draft vocabulary). Row r of every call is row r of the head cache; `select` follows the batch when rows leave."""

    def __init__(self, target, drafter: EagleDrafter, num_rows: int):
        self.target, self.head = target, drafter.head
        self.min_draft_confidence = drafter.min_draft_confidence
        self.embed = target.model.get_input_embeddings()
        self.draft_vocab = drafter.draft_vocab  # [N] ids or None (full vocabulary)
        self.cache = RaggedCache(self.head, num_rows, target.device, config=self.head.layer_config)  # real lengths

    @property
    def extra_modules(self) -> tuple:
        return (self.head,)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.head.config.feature_layers  # (as EagleDrafter's)

    @property
    def projected_vocab(self) -> torch.Tensor | None:
        return None if self.head.own_lm_head else self.draft_vocab  # (as EagleDrafter's)

    def propose(self, contexts: list[DraftContext]) -> list[Draft]:
        """One context per row of the cache, in its order -> each row's draft of up to its num_draft_tokens."""
        feature = self._catch_up(contexts)  # [B, hidden] predicted features of the pending tokens' positions
        real_lengths = self.cache.lengths.clone()
        limits = [context.num_draft_tokens for context in contexts]
        tokens, draft_probs = [[] for _ in contexts], [[] for _ in contexts]
        drafting = [r for r, k in enumerate(limits) if k > 0]  # rows that draft at this position
        while drafting:
            rows = torch.tensor(drafting, device=feature.device)
            logits = self.head.draft_logits(feature[rows], self.target, self.draft_vocab)  # [D, N]
            drawn, probs = draw_rows(logits, [contexts[r] for r in drafting], self.draft_vocab,
                                     [len(tokens[r]) for r in drafting])  # [D], [D, vocab]|None
            confident = confident_rows(logits, probs, self.min_draft_confidence)
            feeding = []
            for i, r in enumerate(drafting):
                if not confident[i]:  # drawn before the check, as alone: it decides how many drafts, never which
                    continue
                tokens[r].append(drawn[i : i + 1])
                if probs is not None:
                    draft_probs[r].append(probs[i : i + 1])
                if len(tokens[r]) < limits[r]:  # the last draft is never fed back
                    feeding.append(r)
            if feeding:
                feature = self._feed(feature, drawn, drafting, feeding)
            drafting = feeding
        self.cache.rollback(real_lengths)
        device = contexts[0].token_ids.device
        return [Draft(torch.cat(t), torch.cat(p) if p else None) if t else Draft.empty(device)
                for t, p in zip(tokens, draft_probs)]

    def _catch_up(self, contexts: list[DraftContext]) -> torch.Tensor:
        """Every row's newly committed positions in one padded head forward, committed: [B, hidden] each row's
        predicted feature of its pending token's position."""
        num_new = [context.hidden_states.shape[0] for context in contexts]  # >= 1: the last is hidden_state
        firsts = [context.token_ids.shape[0] - 1 - n for context, n in zip(contexts, num_new)]
        seen = self.cache.lengths.tolist()
        if firsts != seen:
            raise RuntimeError(
                f"the batched EAGLE drafter's rows saw positions up to {seen} but their next new features are at "
                f"{firsts}: every committed position's hidden state must reach it (DraftContext.hidden_states)"
            )
        features = pad_sequence([context.hidden_states for context in contexts], batch_first=True)  # [B, T, hidden]
        # new_features[i] is at position first + i and reads the embedding of token first + i + 1
        next_ids = pad_sequence([c.token_ids[f + 1 :] for c, f in zip(contexts, firsts)], batch_first=True)  # [B, T]
        width = features.shape[1]
        out = self.head(features, self.embed(next_ids), self.cache.block_positions(width), self.cache.hf_cache,
                        attention_mask=self.cache.block_mask(width, features.dtype))  # [B, T, hidden]
        kept = torch.tensor(num_new, device=features.device)
        self.cache.commit(kept)
        return out[torch.arange(len(contexts), device=features.device), kept - 1]

    def _feed(self, feature: torch.Tensor, drawn: torch.Tensor, drafting: list[int], feeding: list[int]):
        """One [B, 1] head forward of every row's (feature, drafted token) after its entries; only the `feeding` rows'
        entries are committed (the others drafted their last token). -> [B, hidden] the next predicted features."""
        ids = torch.zeros(feature.shape[0], dtype=torch.long, device=feature.device)  # [B]; other rows: any valid id
        ids[torch.tensor(drafting, device=ids.device)] = drawn
        out = self.head(feature[:, None], self.embed(ids)[:, None], self.cache.block_positions(1), self.cache.hf_cache,
                        attention_mask=self.cache.block_mask(1, feature.dtype))  # [B, 1, hidden]
        kept = torch.zeros(feature.shape[0], dtype=torch.long)
        kept[feeding] = 1
        self.cache.commit(kept)
        return out[:, 0]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows ([R] long indices, in the order given), as the batch's cache does."""
        self.cache.select(rows)

    def join(self, num_rows: int) -> None:
        """Rows joining the batch (after its rows): empty head-cache rows, caught up on their prompts at their first
        proposal."""
        self.cache.join(RaggedCache(self.head, num_rows, self.cache.lengths.device, config=self.head.layer_config))

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass
