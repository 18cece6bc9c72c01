"""The exact verifier for a tree of draft tokens: walk down from the root, accepting at most one child per level.

Pure functions over tensors: no model, no cache, no I/O. Rows follow `tree.py`: row 0 scores the root (the
pending token's position), row i + 1 scores node i. Words as in `verifier.py`: a draft token is *accepted*; the
token sampled after every child of the last accepted node was rejected is *recovered*; the token after an
accepted leaf is the *bonus*. On a chain both functions return what `verifier.py` returns (with the same
generator, the same tokens: one uniform per node is drawn up front and the last token is sampled the same way).

Sampling tries the children of the current node in sibling order against `target_now`, the law the next token
must follow given the path so far (the target row, then what the rejections so far leave of it):
- DISTINCT children (deterministic distinct tokens): accept child c with probability target_now[c]; on rejection
  set target_now[c] = 0 and renormalise. Each step emits c with exactly target_now[c].
- SAMPLED children (i.i.d. from one draft_probs row q): recursive rejection sampling, accept with
  min(1, target_now[c] / q[c]); on rejection target_now <- norm(max(0, target_now - q)). Exact because each next
  sibling is a fresh draw of q, independent of the rejections before it (SpecInfer; Chen et al. 2023 "RRS").
When every child is rejected the recovered token is sampled from target_now.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from selfspec.sampling import SamplingConfig, greedy_tokens, keyed_tokens, sample_from
from selfspec.seeded import PositionNoise
from selfspec.tree.draft_tree import DISTINCT, DraftTree
from selfspec.verifier import normalised_or


@dataclass(frozen=True)
class TreeVerdict:
    accepted_nodes: tuple[int, ...]  # the accepted path, root excluded: node indices, each the child of the previous
    next_token: int  # recovered token (a rejection happened) or bonus token (an accepted leaf, or the root is a leaf)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)


def verify_tree_greedy(tree: DraftTree, target_logits: torch.Tensor) -> TreeVerdict:
    """Greedy decoding: follow the child equal to the target's argmax while there is one; next token = that argmax.

    target_logits: [num_nodes + 1, vocab]. The longest path of the tree that greedy decoding would produce.
    """
    target_tokens = greedy_tokens(target_logits).tolist()  # [num_nodes + 1]
    return follow_matching(tree, lambda row, depth: target_tokens[row])


def verify_tree_keyed(tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig, noise: PositionNoise,
                      first_position: int) -> TreeVerdict:
    """Sampling with a seed (`selfspec/seeded.py`): follow the child equal to the target's keyed draw at each depth
    (row `row` at depth d decides sequence position first_position + d); only the rows on the walk are warped. The
    tokens are plain keyed sampling's, whatever the tree held."""
    def target_token(row: int, depth: int) -> int:
        return int(keyed_tokens(target_logits[row], sampling, noise, first_position + depth)[0])

    return follow_matching(tree, target_token)


def follow_matching(tree: DraftTree, target_token: Callable[[int, int], int]) -> TreeVerdict:
    """The walk of the deterministic verifiers: from the root, follow the child whose token is the target's
    `target_token(row, depth)` while there is one; the next token is the target's token where the walk stops."""
    tokens = tree.tokens.tolist()
    path, row = [], 0
    while True:
        token = target_token(row, len(path))
        match = [c for c in tree.children[row] if tokens[c] == token]
        if not match:
            return TreeVerdict(tuple(path), token)
        path.append(match[0])  # DISTINCT siblings match at most once; SAMPLED duplicates: the first one drawn
        row = match[0] + 1


# A sibling rule: (target_now [vocab], draft_row [vocab] or None, token, uniform) -> None when the child is accepted,
# else target_now for the next sibling (a probability vector). The verifier's exactness lives in these two functions.
SiblingRule = Callable[[torch.Tensor, "torch.Tensor | None", int, torch.Tensor], "torch.Tensor | None"]


def try_distinct_child(target_now, draft_row, token, uniform):
    """Accept a deterministic child with probability target_now[token]; else zero that token and renormalise."""
    if uniform < target_now[token]:
        return None
    residual = target_now.clone()
    residual[token] = 0.0
    return normalised_or(residual, target_now)


def try_sampled_child(target_now, draft_row, token, uniform):
    """Accept an i.i.d. draft child with probability min(1, target_now/draft); else the normalised residual."""
    # u < p/q written without the division; p == 0 never accepts, p >= q always does (as in verifier.py).
    if uniform * draft_row[token] < target_now[token]:
        return None
    return normalised_or((target_now - draft_row).clamp_min(0.0), target_now)


def verify_tree_sampled(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> TreeVerdict:
    """Multi-draft speculative sampling over a tree: the emitted tokens have exactly the target's law.

    target_probs: [num_nodes + 1, vocab], warped exactly as the draft side was; float32 or wider (or a `WarpedRows`:
    only the rows of the nodes the walk reaches are then warped).
    tree.draft_probs rows of SAMPLED children are the law they were drawn from; DISTINCT children need none.
    """
    return walk_tree(tree, target_probs, generator, try_distinct_child, try_sampled_child)


def walk_tree(
    tree: DraftTree,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    distinct_rule: SiblingRule,
    sampled_rule: SiblingRule,
) -> TreeVerdict:
    """The walk shared by every rule (tests plant broken rules here to show the law test catches them)."""
    num_nodes = tree.num_nodes
    # One uniform per node, drawn up front: a chain consumes the generator exactly as verify_sampled does.
    uniform = torch.rand(num_nodes, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    tokens = tree.tokens.tolist()
    path, row = [], 0
    target_now = target_probs[0]  # [vocab]
    while True:
        accepted_child = None
        for child in tree.children[row]:
            if tree.child_kinds[row] == DISTINCT:
                outcome = distinct_rule(target_now, None, tokens[child], uniform[child])
            else:
                draft_row = tree.draft_probs[child].to(target_probs.dtype)  # [vocab], shared by all siblings
                outcome = sampled_rule(target_now, draft_row, tokens[child], uniform[child])
            if outcome is None:
                accepted_child = child
                break
            target_now = outcome
        if accepted_child is None:  # a leaf (bonus) or every child rejected (recovered)
            return TreeVerdict(tuple(path), int(sample_from(target_now, generator)))
        path.append(accepted_child)
        row = accepted_child + 1
        target_now = target_probs[row]
