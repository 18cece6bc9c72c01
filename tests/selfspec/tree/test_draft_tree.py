"""DraftTree: table-driven structure cases (children, depths, ancestor mask, paths) and validation errors."""
import pytest
import torch

from selfspec.tree.draft_tree import DISTINCT, SAMPLED, DraftTree


def tree(parents, tokens=None, **kwargs):
    tokens = tokens if tokens is not None else list(range(10, 10 + len(parents)))
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), **kwargs)


# parents, children by row (row 0 = root), depths, path to the last node
CASES = [
    ([], [()], [], []),
    ([-1], [(0,), ()], [1], [0]),
    ([-1, 0, 1], [(0,), (1,), (2,), ()], [1, 2, 3], [0, 1, 2]),  # a chain
    ([-1, -1, -1], [(0, 1, 2), (), (), ()], [1, 1, 1], [2]),  # top-3 at the root only
    ([-1, -1, 0, 0, 2, 1], [(0, 1), (2, 3), (5,), (4,), (), (), ()], [1, 1, 2, 2, 3, 2], [1, 5]),
]


@pytest.mark.parametrize("parents, children, depths, last_path", CASES)
def test_structure(parents, children, depths, last_path):
    t = tree(parents)
    assert t.children == tuple(children)
    assert t.depths.tolist() == depths
    assert t.position_offsets().tolist() == [0, *depths]
    assert t.path_to(len(parents) - 1) == last_path
    assert t.path_to(-1) == []


@pytest.mark.parametrize("parents, children, depths, last_path", CASES)
def test_ancestor_mask_holds_exactly_the_path(parents, children, depths, last_path):
    t = tree(parents)
    mask = t.ancestor_mask()
    assert mask.shape == (len(parents) + 1, len(parents) + 1)
    for node in range(-1, len(parents)):
        rows = {0, *(n + 1 for n in t.path_to(node))}
        assert set(mask[node + 1].nonzero()[:, 0].tolist()) == rows


def test_ancestor_mask_of_a_large_irregular_tree_holds_exactly_each_path():
    """A 300-node tree (a GPU's size) whose depths interleave in node order: the mask is built a level at a time."""
    generator = torch.Generator().manual_seed(0)
    parents = [-1, -1] + [int(torch.randint(-1, node, (1,), generator=generator)) for node in range(2, 300)]
    t = tree(parents)
    assert len(set(t.depths.tolist())) > 4
    expected = torch.zeros(301, 301, dtype=torch.bool)
    for node in range(-1, 300):
        expected[node + 1, [0, *(n + 1 for n in t.path_to(node))]] = True
    assert torch.equal(t.ancestor_mask(), expected)


def test_chain_constructor():
    probs = torch.full((3, 5), 0.2, dtype=torch.float64)
    t = DraftTree.chain(torch.tensor([4, 1, 2]), probs)
    assert t.parents.tolist() == [-1, 0, 1] and t.child_kinds == (SAMPLED,) * 4
    assert DraftTree.chain(torch.tensor([4, 1])).child_kinds == (DISTINCT,) * 3
    assert DraftTree.chain(torch.tensor([], dtype=torch.long)).num_nodes == 0


@pytest.mark.parametrize(
    "parents, tokens, kwargs, message",
    [
        ([-1, 1], None, {}, "earlier node"),
        ([-1, -2], None, {}, "earlier node"),
        ([0], None, {}, "earlier node"),
        ([-1, -1], [5, 5], {}, "repeat a token"),
        ([-1, -1], None, dict(child_kinds=(SAMPLED, DISTINCT, DISTINCT)), "need draft_probs"),
        ([-1, -1], None, dict(child_kinds=(DISTINCT,)), "child_kinds"),
        ([-1, -1], None, dict(child_kinds=("topk", DISTINCT, DISTINCT)), "child_kinds"),
        ([-1, -1], None, dict(draft_probs=torch.eye(3, dtype=torch.float64)[:2]), "i.i.d."),
        ([-1, -1], None, dict(draft_probs=torch.ones(3, 4)), r"\[2, vocab\]"),
    ],
)
def test_validation_errors(parents, tokens, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tree(parents, tokens, **kwargs)


def test_tokens_and_parents_must_be_long_and_aligned():
    with pytest.raises(ValueError, match="long"):
        DraftTree(torch.tensor([1.0]), torch.tensor([-1]))
    with pytest.raises(ValueError, match="parents"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([-1]))


def test_sampled_duplicates_are_allowed_and_distinct_is_the_point_mass_default():
    probs = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    t = tree([-1, -1], [1, 1], draft_probs=probs)  # two i.i.d. draws may coincide
    assert t.child_kinds == (SAMPLED,) * 3
