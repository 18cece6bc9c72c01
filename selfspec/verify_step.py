"""One verification step: the target's forward over the pending token and the draft (a chain, or a tree with its
4D mask), the exact verdict, and the cache cut back to what was accepted (rollback by length for a chain; the
accepted path moved into place for a tree). The decode loop and the batched loop both verify through `verify`.
Knows the target, the cache and the verifiers; nothing about drafters or stopping.
"""
from __future__ import annotations

import torch

from selfspec.drafters.base import Draft
from selfspec.sampling import SamplingConfig, WarpedRows
from selfspec.tree import DraftTree
from selfspec.tree_cache import keep_path, path_offsets
from selfspec.tree_forward import tree_forward
from selfspec.tree_verifier import verify_tree_greedy, verify_tree_sampled
from selfspec.verifier import Verdict, verify_greedy, verify_sampled


def verify(draft: Draft, target_logits: torch.Tensor, sampling: SamplingConfig, generator) -> Verdict:
    if sampling.greedy:
        return verify_greedy(draft.tokens, target_logits)
    return verify_sampled(draft.tokens, draft.probs, WarpedRows(target_logits, sampling), generator)


def verify_chain(target, pending, draft: Draft, num_tokens: int, cache, sampling, generator):
    """A chain: [pending, *draft.tokens] in one forward, the chain verifier, rollback by length."""
    verify_ids = torch.cat([pending, draft.tokens])  # [k + 1]
    # [k + 1, hidden]; an early-exit draft already ran the first layers over verify_ids: resume after them
    hidden_all = target.forward(verify_ids, cache, draft.prefilled_layers, draft.prefilled_hidden)
    verdict = verify(draft, target.logits(hidden_all), sampling, generator)
    cache.rollback(num_tokens + verdict.num_accepted)  # keep pending + accepted; drop rejected drafts
    return verdict, draft.tokens[: verdict.num_accepted], hidden_all[: verdict.num_accepted + 1]


def verify_tree(target, pending, tree: DraftTree, num_tokens: int, cache, sampling, generator):
    """A tree: [pending, *tree.tokens] in one forward with the tree's 4D mask, the tree verifier, then the cache keeps
    the accepted path only (moved into place: no memory for rejected branches)."""
    hidden_all = tree_forward(target, int(pending[0]), tree, cache)  # [num_nodes + 1, hidden], row 0 = pending
    target_logits = target.logits(hidden_all)  # [num_nodes + 1, vocab]
    if sampling.greedy:
        verdict = verify_tree_greedy(tree, target_logits)
    else:  # DISTINCT children need no draft_probs; SAMPLED ones carry theirs in the tree
        verdict = verify_tree_sampled(tree, WarpedRows(target_logits, sampling), generator)
    rows = path_offsets(verdict.accepted_nodes)  # [num_accepted + 1] rows of pending + the accepted path
    keep_path(cache, num_tokens - 1, rows)
    accepted = tree.tokens[list(verdict.accepted_nodes)]  # [num_accepted]
    return verdict, accepted, hidden_all[rows]
