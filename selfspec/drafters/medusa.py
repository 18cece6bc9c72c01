"""Medusa drafting: K heads read the hidden state the last verify forward already produced; no extra forward.

Greedy: each head's argmax (point masses). Sampling: each head's warped distribution, sampled; its draft_probs
go to the verifier. Head k's guess does not depend on the heads before it, which is a valid (if crude) chain.
Trees (`DraftContext.tree_size` = N > 0): each head's top-k tokens, and of all paths through them the N most probable
nodes by the product of the heads' probabilities; children are DISTINCT (deterministic), also when sampling.
The drafter owns its heads: it loads them (or checks given ones against the model) and places them on the model.
"""
from __future__ import annotations

from functools import partial

import torch

from selfspec.drafters.base import (
    Draft, DraftContext, check_count, check_probability, draw_draft, load_extra_module, projection_weights,
    top_draft_tokens, weight_share,
)
from selfspec.tree.select import ROOT, TreeCandidates, score_floor
from selfspec.sampling import greedy_tokens, top_probability


class MedusaDrafter:
    """heads: `MedusaHeads` or their directory; with `model`, checked against it and moved to its device and dtype
    (without, ready heads are used as they are).
    min_draft_confidence: keep heads only up to the first whose top probability is below this (0 = keep all).
    The default 0.1 was measured on the reference model's 4 heads, replaying their greedy drafts:
    +8 % tokens per unit cost at k = 4 on this CPU (1.37x vs 1.27x), +5 % under num_draft_tokens="auto"; 0.2
    and above cut too many right drafts. An unsure head 1 then means a plain decoding step, which is cheaper
    than verifying a likely-wrong draft (verifying 2 tokens costs ~1.4 decodes here). In a tree it caps the depth
    the same way.
    tree_top_k: candidate tokens per head in a tree (3: with N nodes, most of them sit in the first two heads'
    top 3; not measured yet)."""

    def __init__(self, heads, model=None, min_draft_confidence: float = 0.1, tree_top_k: int = 3):
        from heads import MedusaHeads

        check_probability("min_draft_confidence", min_draft_confidence)
        check_count("tree_top_k", tree_top_k)
        if model is not None:
            heads = load_extra_module(heads, model, MedusaHeads, "these heads")
        elif not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads must be a MedusaHeads module (or, with model=..., its directory), got {type(heads).__name__}")
        self.heads = heads
        self.min_draft_confidence = min_draft_confidence
        self.tree_top_k = tree_top_k
        self.draft_cost = 0.0 if model is None else _draft_cost(heads, model)

    @property
    def extra_modules(self) -> tuple:
        return (self.heads,)

    @property
    def max_draft_tokens(self) -> int:
        """The most tokens a chain draft holds: one per head (a batch's width is capped by it)."""
        return self.heads.num_heads

    @property
    def projected_vocab(self) -> torch.Tensor | None:
        """The draft vocabulary the heads project onto through the target's shared LM head (None: the full vocabulary,
        or the heads' own LM heads)."""
        return self.heads.draft_vocab if self.heads.lm_heads is None else None

    def propose(self, context: DraftContext) -> Draft:
        return self.propose_rows([context])[0]

    def propose_rows(self, contexts: list[DraftContext]) -> list[Draft]:
        """One draft per context (a batch's rows): the heads run once over every row's hidden state, then each row
        draws from its own slice with its own generator, as it would alone."""
        ks = [min(c.num_draft_tokens, self.heads.num_heads) for c in contexts]
        if max(ks) == 0:
            return [Draft.empty(c.token_ids.device) for c in contexts]
        draft_vocab = self.heads.draft_vocab  # [N] ids or None: a shared LM head projects onto those rows only
        target = contexts[0].target
        project = target.logits if draft_vocab is None else partial(target.logits, vocab_ids=draft_vocab)
        if len(contexts) == 1:  # one sequence: [hidden] in, as it always ran (a [1, hidden] product may round apart)
            logits = self.heads(contexts[0].hidden_state, project, ks[0])[None]  # [1, k, N or vocab]
        else:
            hidden = torch.stack([c.hidden_state for c in contexts])  # [B, hidden]
            logits = self.heads(hidden, project, max(ks))  # [B, max k, N or vocab]
        if draft_vocab is not None and not self.heads.config.share_lm_head:
            logits = logits[..., draft_vocab]  # own full-vocabulary projections: keep the draft vocabulary's columns
        if len(contexts) > 1 and all(c.sampling.greedy and not c.tree_size for c in contexts):
            return self._greedy_chains(logits, ks, contexts[0].token_ids.device)
        return [self._draft(row_logits[:k], context) if k else Draft.empty(context.token_ids.device)
                for row_logits, k, context in zip(logits, ks, contexts)]

    def _greedy_chains(self, logits: torch.Tensor, ks: list[int], device) -> list[Draft]:
        """[B, max k, N] every row's heads' logits -> each row's greedy chain of up to ks[r] tokens, what `_draft`
        gives it alone, from one argmax and one softmax over all rows (8 rows of 2 heads over the reference model's
        8,192 logits: 0.74 ms row by row, 0.32 ms so; an Intel Xeon with AVX-512, one thread)."""
        tokens = greedy_tokens(logits)  # [B, max k]
        if self.heads.draft_vocab is not None:
            tokens = self.heads.draft_vocab[tokens]
        lengths = ks
        if self.min_draft_confidence:  # each row's heads up to its first unsure one
            lengths = [min(k, n) for k, n in zip(ks, self._sure_heads(top_probability(logits, None)).tolist())]
        return [Draft(row_tokens[:n]) if n else Draft.empty(device) for row_tokens, n in zip(tokens, lengths)]

    def _draft(self, logits: torch.Tensor, context: DraftContext) -> Draft:
        """[k, N] the first k heads' logits for one sequence -> its draft (a chain, or a tree when asked)."""
        if context.tree_size:
            return self._propose_tree(logits, context)
        # [k], [k, vocab] or None; head i drafts depth i
        tokens, draft_probs = draw_draft(logits, context, self.heads.draft_vocab, range(logits.shape[0]))
        if self.min_draft_confidence:
            # Only the number proposed changes (not which tokens, nor their law): the verifier stays exact.
            keep = int(self._sure_heads(top_probability(logits, draft_probs)))
            tokens, draft_probs = tokens[:keep], None if draft_probs is None else draft_probs[:keep]
        return Draft(tokens, draft_probs)

    def _sure_heads(self, confidence: torch.Tensor) -> torch.Tensor:
        """[..., k] the heads' confidences -> [...] how many lead before the first one below `min_draft_confidence`
        (all k when none is): the heads a draft keeps, a chain's length or a tree's depth."""
        return (~(confidence < self.min_draft_confidence)).int().cumprod(dim=-1).sum(dim=-1)

    def max_tree_nodes(self, depth: int, tree_size: int) -> int:
        """The most nodes a tree of at most `depth` levels holds: every head's top k, all their paths, the best N."""
        depth = min(depth, self.heads.num_heads)
        return min(tree_size, sum(self.tree_top_k ** d for d in range(1, depth + 1)))

    def _propose_tree(self, logits: torch.Tensor, context: DraftContext) -> Draft:
        """[depth, N] the heads' logits -> the tree of the `context.tree_size` most probable nodes."""
        tokens, log_probs = top_draft_tokens(logits, context, self.tree_top_k, self.heads.draft_vocab,
                                             range(logits.shape[0]))  # [depth, k]; head i drafts depth i
        depth = tokens.shape[0]
        if self.min_draft_confidence:  # heads up to the first unsure one, as for a chain
            depth = int(self._sure_heads(log_probs[:, 0].exp()))
        candidates = TreeCandidates(tokens.device)
        ids = torch.full((1,), ROOT, dtype=torch.long, device=tokens.device)  # [F] the nodes to expand
        scores = log_probs.new_zeros(1)  # [F] their cumulative log draft probabilities
        for d in range(depth):
            num_parents = ids.shape[0]
            ids, scores = candidates.add_children(
                ids, scores, tokens[d].expand(num_parents, -1), log_probs[d].expand(num_parents, -1)
            )
            # A node among the N best overall is among the N best of its depth: expanding those loses none.
            best = scores.topk(min(context.tree_size, scores.shape[0])).indices
            ids, scores = ids[best], scores[best]
        tree_tokens, parents = candidates.best(context.tree_size, score_floor(context.min_node_probability))
        return Draft(tree_tokens, parents=parents) if tree_tokens.numel() else Draft.empty(tokens.device)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass


def _draft_cost(heads, model) -> float:
    """A draft token meets one head's block (and its own LM head, if any), and a share of the shared LM head's rows
    (`weight_share`): one matrix product projects every head a step drafts, so its rows are spread over the heads.
    Reference model, 4 heads: about 0.08 of a decode per token (measured ad hoc: 4 heads ~0.22 decodes, 1 head
    ~0.15); SmolLM2's 4 heads with an 8192-token draft vocabulary: about 0.01."""
    per_head = sum(p.numel() for p in heads.parameters()) // heads.num_heads
    rows = projection_weights(model, heads.draft_vocab) if heads.lm_heads is None else 0
    return weight_share(model, extra_weights=per_head + rows // heads.num_heads)
