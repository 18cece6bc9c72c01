"""A tree of draft tokens: which node follows which, and how each node's children were drafted.

A frozen description only: no model, no cache, no sampling. Node i is draft token `tokens[i]`; its parent is
node `parents[i]` (-1 = the root, i.e. the pending token every draft follows). Rows of anything scored over the
tree (target logits, attention mask) use one convention: row 0 is the root, row i + 1 is node i. A chain is the
tree whose node i has parent i - 1.

How the children of one parent were drafted decides how the verifier may test them (`tree_verifier.py`):
- DISTINCT: distinct tokens picked deterministically given the prefix (top-k of a head, EAGLE-2 reranking);
  any selection rule is allowed as long as it does not look at the target. Point-mass drafts (n-gram, argmax) are
  this kind, so draft_probs may be None.
- SAMPLED: i.i.d. draws from one draft distribution, `draft_probs[child]` (equal rows for all siblings). The
  number of siblings must not depend on the values drawn (no pruning or deduplicating of sampled siblings by
  value: the survivors would no longer be i.i.d. and recursive rejection sampling would stop being exact).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

DISTINCT = "distinct"  # children are distinct tokens chosen deterministically (top-k): accept with the target prob
SAMPLED = "sampled"  # children are i.i.d. samples of draft_probs: recursive rejection sampling
CHILD_KINDS = (DISTINCT, SAMPLED)


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor  # [num_nodes] long, draft token of each node
    parents: torch.Tensor  # [num_nodes] long, parent node index (< own index), -1 = the root (pending token)
    # [num_nodes, vocab] the distribution node i was drafted from, or None when every child kind is DISTINCT.
    draft_probs: torch.Tensor | None = None
    # [num_nodes + 1] how each row's children were drafted: child_kinds[0] for the root's, [i + 1] for node i's.
    child_kinds: tuple[str, ...] = field(default=())

    def __post_init__(self):
        n = self.tokens.shape[0] if self.tokens.ndim == 1 else -1
        if self.tokens.ndim != 1 or self.tokens.dtype != torch.long:
            raise ValueError(
                f"tokens must be a 1-D long tensor [num_nodes], got {self.tokens.dtype} {tuple(self.tokens.shape)}"
            )
        if self.parents.shape != (n,) or self.parents.dtype != torch.long:
            raise ValueError(
                f"parents must be a long tensor of shape [{n}] like tokens, got {tuple(self.parents.shape)}"
            )
        for node, parent in enumerate(self._parent_list):
            if not -1 <= parent < node:
                raise ValueError(
                    f"node {node} has parent {parent}: a parent must be an earlier node or -1 (the root), so that "
                    "nodes are in topological order"
                )
        if not self.child_kinds:
            default = DISTINCT if self.draft_probs is None else SAMPLED
            object.__setattr__(self, "child_kinds", (default,) * (n + 1))
        kinds = tuple(self.child_kinds)
        object.__setattr__(self, "child_kinds", kinds)
        if len(kinds) != n + 1 or any(kind not in CHILD_KINDS for kind in kinds):
            raise ValueError(
                f"child_kinds must hold {n + 1} entries (root first), each one of {CHILD_KINDS}, got {kinds}"
            )
        if self.draft_probs is not None and (self.draft_probs.ndim != 2 or self.draft_probs.shape[0] != n):
            raise ValueError(
                f"draft_probs must be [{n}, vocab] (one row per node) or None, got {tuple(self.draft_probs.shape)}"
            )
        token_list = self.tokens.tolist()  # one device-to-host copy, not one per node (a sync each on a GPU)
        for row, children in enumerate(self.children):
            if len(children) == 0:
                continue
            if kinds[row] == DISTINCT:
                sibling_tokens = [token_list[c] for c in children]
                if len(set(sibling_tokens)) != len(sibling_tokens):
                    raise ValueError(f"the DISTINCT children of row {row} repeat a token: {sibling_tokens}")
            else:
                if self.draft_probs is None:
                    raise ValueError(
                        f"row {row} has SAMPLED children, which need draft_probs (the law they were drawn from)"
                    )
                first = self.draft_probs[children[0]]
                if any(not torch.equal(self.draft_probs[c], first) for c in children[1:]):
                    raise ValueError(
                        f"the SAMPLED children of row {row} must be i.i.d. draws of one distribution: "
                        "their draft_probs rows differ"
                    )

    @classmethod
    def chain(cls, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None) -> "DraftTree":
        """The chain tokens[0] -> tokens[1] -> ...: each node sampled from its draft_probs row, or a point mass."""
        n = tokens.shape[0]
        return cls(tokens, torch.arange(-1, n - 1, device=tokens.device), draft_probs)

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    @cached_property
    def _parent_list(self) -> list[int]:
        return [int(p) for p in self.parents.tolist()]

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """[num_nodes + 1] child node indices per row (row 0 = root), in sibling order (= node order)."""
        lists: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for node, parent in enumerate(self._parent_list):
            lists[parent + 1].append(node)
        return tuple(tuple(c) for c in lists)

    @cached_property
    def depths(self) -> torch.Tensor:
        """[num_nodes] long, 1 for the root's children, 2 for theirs, ..."""
        depth = [0] * (self.num_nodes + 1)  # by row
        for node, parent in enumerate(self._parent_list):
            depth[node + 1] = depth[parent + 1] + 1
        return torch.tensor(depth[1:], dtype=torch.long, device=self.tokens.device)

    def position_offsets(self) -> torch.Tensor:
        """[num_nodes + 1] long, position of each row after the cache's contents: 0 for the root, then depth."""
        return torch.cat([self.depths.new_zeros(1), self.depths])

    def ancestor_mask(self) -> torch.Tensor:
        """[num_nodes + 1, num_nodes + 1] bool; [i, j] is True when row j is row i or one of its ancestors."""
        n = self.num_nodes
        mask = torch.eye(n + 1, dtype=torch.bool)
        mask[:, 0] = True  # everything descends from the root
        parent_rows = torch.tensor(self._parent_list, dtype=torch.long) + 1  # [n] row of each node's parent
        depths = self.depths.cpu()
        for depth in range(1, int(depths.max()) + 1 if n else 1):  # a level at a time: its parents' rows are complete
            rows = torch.nonzero(depths == depth).flatten()  # [m] node indices at this depth
            mask[rows + 1] |= mask[parent_rows[rows]]
        return mask.to(self.tokens.device)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (root excluded); [] for node == -1 (the root)."""
        path = []
        while node != -1:
            path.append(node)
            node = self._parent_list[node]
        return path[::-1]
