"""One verification step: the target's forward over the pending token and the draft (a chain, or a tree with its
4D mask), the exact verdict, and the cache cut back to what was accepted (rollback by length for a chain; the
accepted path moved into place for a tree); and a probe scored in shadow (`verify_in_shadow`, `score_probe`): plain
decoding's step, with the probe's token scored against it. The decode loop verifies through `verify` and scores
probes through `score_probe`; so does the batched loop for unseeded sampling (greedy and seeded rows are verified all
at once by `verdicts.py`, tested equal to these).
Knows the target, the cache and the verifiers; nothing about drafters or stopping.
"""
from __future__ import annotations

import torch

from selfspec.drafters.base import Draft
from selfspec.sampler import Sampler
from selfspec.sampling import WarpedRows
from selfspec.tree.draft_tree import DraftTree
from selfspec.tree.cache import keep_path, path_offsets
from selfspec.tree.forward import tree_forward
from selfspec.verifier import Verdict, probe_accepted, verify_sampled


def verify(draft: Draft, target_logits: torch.Tensor, sampler: Sampler, first_position: int) -> Verdict:
    """A chain's verdict; row 0 of target_logits decides sequence position `first_position` (the pending token's
    index + 1): `Sampler.verify_chain`. (A batch verifies greedy and seeded chains all at once: `verdicts.py`, tested
    equal to this.)"""
    return sampler.verify_chain(draft.tokens, draft.probs, target_logits, first_position)


def verify_chain(target, pending, draft: Draft, num_tokens: int, cache, sampler: Sampler):
    """A chain: [pending, *draft.tokens] in one forward, the chain verifier, rollback by length."""
    verify_ids = torch.cat([pending, draft.tokens])  # [k + 1]
    # [k + 1, hidden]; an early-exit draft already ran the first layers over verify_ids: resume after them
    hidden_all = target.forward(verify_ids, cache, draft.prefilled_layers, draft.prefilled_hidden)
    verdict = verify(draft, target.logits(hidden_all), sampler, num_tokens)
    cache.rollback(num_tokens + verdict.num_accepted)  # keep pending + accepted; drop rejected drafts
    return verdict, draft.tokens[: verdict.num_accepted], hidden_all[: verdict.num_accepted + 1]


def score_probe(probe: Draft, target_logits: torch.Tensor, sampler: Sampler, uniform: float, first_position: int
                ) -> tuple[Verdict, bool]:
    """target_logits [1, vocab]: the target's scores after the pending token, from a forward over it alone ->
    (plain decoding's verdict: no draft accepted, the next token drawn exactly as a step without drafts draws it;
    whether the verifier would have accepted the probe's one token: by equality (greedy, keyed), it is the next token;
    rejection, u < p / q with u = `uniform`, never a draw from the request's generator)."""
    token = int(probe.tokens[0])
    if sampler.by_equality:
        verdict = verify(Draft(probe.tokens[:0]), target_logits, sampler, first_position)
        return verdict, token == verdict.next_token
    target_probs = WarpedRows(target_logits, sampler.config)  # row 0 is warped once, for the draw and for the score
    verdict = verify_sampled(probe.tokens[:0], None, target_probs, sampler.generator)
    draft_prob = 1.0 if probe.probs is None else float(probe.probs[0, token])
    return verdict, probe_accepted(token, draft_prob, target_probs[0], uniform)


def verify_in_shadow(target, pending, probe: Draft, num_tokens: int, cache, sampler: Sampler, uniform: float):
    """A one-token probe scored for free: the forward runs over the pending token alone, so the step is exactly plain
    decoding's (same forward, same next token, same draws), and the probe is scored against the distribution that
    forward computed anyway (`score_probe`). A probe verified for real costs a wider forward (SmolLM2 on an AMD EPYC:
    1.6-1.7 decodes against 1) for a draft "auto" expects to be rejected. An early-exit probe already ran the first
    layers over the pending token and its own: the forward resumes after them for the pending token, and the probe
    token's entries in those layers are cut.
    -> (verdict, [0] accepted, [1, hidden] the pending token's state, whether the probe would have been accepted)."""
    start_hidden = None if probe.prefilled_hidden is None else probe.prefilled_hidden[:1]  # the pending token's
    hidden = target.forward(pending, cache, probe.prefilled_layers, start_hidden)  # [1, hidden]
    if probe.prefilled_layers:
        cache.rollback(num_tokens)  # committed + pending; drops the probe token from the first layers
    verdict, accepted = score_probe(probe, target.logits(hidden), sampler, uniform, num_tokens)
    return verdict, probe.tokens[:0], hidden, accepted


def verify_tree(target, pending, tree: DraftTree, num_tokens: int, cache, sampler: Sampler):
    """A tree: [pending, *tree.tokens] in one forward with the tree's 4D mask, the tree verifier, then the cache keeps
    the accepted path only (moved into place: no memory for rejected branches)."""
    hidden_all = tree_forward(target, int(pending[0]), tree, cache)  # [num_nodes + 1, hidden], row 0 = pending
    verdict = sampler.verify_tree(tree, target.logits(hidden_all), num_tokens)  # [num_nodes + 1, vocab] logits
    rows = path_offsets(verdict.accepted_nodes)  # [num_accepted + 1] rows of pending + the accepted path
    keep_path(cache, num_tokens - 1, rows)
    accepted = tree.tokens[list(verdict.accepted_nodes)]  # [num_accepted]
    return verdict, accepted, hidden_all[rows]
