"""Which draft tokens make a tree: candidate nodes scored by cumulative draft log-probability, grown depth by depth,
and the N most probable kept (Medusa's most probable paths, EAGLE-2's reranking).

Knows no model, head or verifier: drafters add each depth's candidates (a node's top-k children, DISTINCT tokens) and
ask for the best N. A child's score is its parent's plus a log-probability <= 0, so a kept node's ancestors are always
kept before it: the N best form a tree, already in topological order.
"""
from __future__ import annotations

import math

import torch

ROOT = -1  # the pending token: the parent of depth-1 candidates


def score_floor(min_node_probability: float) -> float:
    """`DraftContext.min_node_probability` -> the score (cumulative log draft probability) a kept node must exceed."""
    return math.log(min_node_probability) if min_node_probability > 0 else -math.inf


class TreeCandidates:
    def __init__(self, device):
        self.device = device
        self._tokens: list[torch.Tensor] = []  # per added block: [M] token ids
        self._parents: list[torch.Tensor] = []  # per added block: [M] candidate id of the parent (ROOT = the root)
        self._scores: list[torch.Tensor] = []  # per added block: [M] cumulative log draft probability
        self.num_candidates = 0

    def add_children(self, parent_ids: torch.Tensor, parent_scores: torch.Tensor, tokens: torch.Tensor,
                     log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """parent_ids [F] long (ROOT for the root), parent_scores [F], tokens and log_probs [F, k] (each row distinct
        tokens) -> ([F * k] ids, [F * k] cumulative scores) of the new candidates, row by row."""
        num_children = tokens.shape[-1]
        scores = (parent_scores[:, None] + log_probs.to(parent_scores.dtype)).flatten()  # [F * k]
        ids = torch.arange(self.num_candidates, self.num_candidates + scores.shape[0], device=self.device)
        self._tokens.append(tokens.flatten())
        self._parents.append(parent_ids.repeat_interleave(num_children))
        self._scores.append(scores)
        self.num_candidates += scores.shape[0]
        return ids, scores

    def kth_best_score(self, k: int) -> float:
        """The k-th highest score among the candidates so far (-inf while there are fewer than k). A node scoring at
        most this has no descendant among the k best of the finished tree: a child scores at most its parent, the
        k-th best can only rise as candidates are added, and on a tie the earlier candidate ranks first (`best`). So
        expanding it cannot change the tree (`frontier`'s floor)."""
        if self.num_candidates < k or k < 1:
            return -torch.inf
        return float(torch.cat(self._scores).topk(k).values[-1])

    def best(self, budget: int, floor: float = -torch.inf) -> tuple[torch.Tensor, torch.Tensor]:
        """The `budget` most probable candidates scoring above `floor` (default: of probability > 0) -> ([n] tokens,
        [n] parents as indices into the kept nodes, -1 = the root), most probable first. A parent scores at least its
        child, so what is kept is a tree."""
        if not self._tokens:
            empty = torch.empty(0, dtype=torch.long, device=self.device)
            return empty, empty
        tokens, parents, scores = torch.cat(self._tokens), torch.cat(self._parents), torch.cat(self._scores)
        keep = kept(scores, budget, floor)  # [n]
        position = torch.full((self.num_candidates,), ROOT, dtype=torch.long, device=self.device)
        position[keep] = torch.arange(keep.shape[0], device=self.device)
        kept_parents = parents[keep]
        new_parents = torch.where(kept_parents == ROOT, kept_parents, position[kept_parents.clamp_min(0)])  # [n]
        return tokens[keep], new_parents


def kept(scores: torch.Tensor, budget: int, floor: float = -torch.inf) -> torch.Tensor:
    """[n] positions of the `budget` highest of `scores` [M] above `floor`, highest first; stable, so on a tie (a child
    of probability 1) the parent, added earlier, stays first. `TreeCandidates.best` keeps these candidates."""
    order = torch.sort(scores, descending=True, stable=True).indices[:budget]
    return order[scores[order] > floor]


def frontier(ids: torch.Tensor, scores: torch.Tensor, width: int, floor: float = -torch.inf) -> torch.Tensor:
    """[F'] positions (into ids/scores) of the `width` best candidates scoring above `floor` (default: of probability
    > 0): the nodes to expand. With floor = `TreeCandidates.kth_best_score(N)`, the nodes left out could not put a
    descendant into the N best, so the tree is the same and a level none of whose nodes can is not drafted at all."""
    top = scores.topk(min(width, scores.shape[0]))
    return top.indices[top.values > floor]
