"""Which nodes make a tree (`selfspec/tree/select.py`): the N most probable candidates, and with a floor
only those above it; what is kept is always a tree (every kept node's parent kept before it)."""
import math

import torch

from selfspec.tree.select import ROOT, TreeCandidates, score_floor


def candidates():
    """Root children a (0.6), b (0.3), c (0.1); a's children d (0.6 * 0.5), e (0.6 * 0.2); b's children f (0.3 * 0.9)
    and g (~0)."""
    tree = TreeCandidates("cpu")
    log = lambda ps: torch.tensor([[math.log(p) for p in ps]])  # noqa: E731
    ids, scores = tree.add_children(torch.tensor([ROOT]), torch.zeros(1), torch.tensor([[10, 11, 12]]),
                                    log([0.6, 0.3, 0.1]))
    tree.add_children(ids[:2], scores[:2], torch.tensor([[13, 14], [15, 16]]),
                      torch.log(torch.tensor([[0.5, 0.2], [0.9, 1e-9]])))
    return tree


def test_the_best_nodes_form_a_tree_most_probable_first():
    tokens, parents = candidates().best(5)
    # by probability: a .6, then b and d (.3 each, the earlier candidate first), f .27, e .12
    assert tokens.tolist() == [10, 11, 13, 15, 14]
    assert parents.tolist() == [-1, -1, 0, 1, 0]


def test_a_floor_keeps_only_nodes_above_it_and_still_a_tree():
    """Floor 0.25: a, b, d, f (0.27) kept; e (0.12) and c (0.1) not, whatever the budget. Catches (planted): the
    floor ignored (5 nodes), compared with the node's own probability rather than its path's (e at 0.2 < 0.25 would
    pass, f at 0.9 would be kept at any floor)."""
    tokens, parents = candidates().best(6, score_floor(0.25))
    assert tokens.tolist() == [10, 11, 13, 15] and parents.tolist() == [-1, -1, 0, 1]
    tokens, _ = candidates().best(6, score_floor(0.28))
    assert tokens.tolist() == [10, 11, 13]  # f (0.27) now below
    assert candidates().best(2, score_floor(0.25))[0].tolist() == [10, 11]  # the budget still caps
    assert candidates().best(6, score_floor(0.0))[0].numel() == 6  # 0: no floor (only probability-0 nodes dropped)
    assert score_floor(0.0) == -math.inf and score_floor(0.5) == math.log(0.5)
