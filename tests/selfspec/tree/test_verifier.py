"""The tree verifier: greedy cases exactly, chains exactly as the chain verifier, the output law by enumeration.

The law test: a tiny vocabulary, a target law and a draft law per prefix, trees drafted afresh each trial (top-k
DISTINCT children, i.i.d. SAMPLED children, both mixed). Each trial's emitted tokens (accepted path + next token)
are continued with the target's own samples to a fixed length, as the decode loop's next steps would; if the
verifier is exact the whole sequence follows the target law, computed by enumeration. Planted bugs in the sibling
rules must fail the same test.
"""
import itertools

import pytest
import torch

from selfspec.tree.draft_tree import DISTINCT, SAMPLED, DraftTree
from selfspec.tree.verifier import (
    TreeVerdict,
    try_distinct_child,
    try_sampled_child,
    verify_tree_greedy,
    verify_tree_sampled,
    walk_tree,
)
from selfspec.verifier import verify_greedy, verify_sampled
from tests.selfspec.exactness import law_pvalue


def rows(*distributions):
    return torch.tensor(distributions, dtype=torch.float64)


def tree(parents, tokens, **kwargs):
    return DraftTree(torch.tensor(tokens), torch.tensor(parents, dtype=torch.long), **kwargs)


# ---------------------------------------------------------------- greedy

#                      root  n0  n1  n2  n3  n4   (argmax of each row)
GREEDY_ARGMAX = [5, 7, 1, 2, 9, 4]
GREEDY_TREE = tree([-1, -1, 0, 0, 1], [3, 5, 6, 7, 1])  # root -> {3, 5}; 3 -> {6, 7}; 5 -> {1}


def one_hot_logits(argmax, vocab=10):
    return torch.nn.functional.one_hot(torch.tensor(argmax), vocab).to(torch.float64) * 3.0


@pytest.mark.parametrize(
    "argmax, accepted, next_token",
    [
        ([5, 7, 1, 2, 9, 4], (1, 4), 4),  # root -> 5 (node 1) -> 1 (node 4, a leaf) -> bonus = row 5's argmax
        ([3, 7, 1, 2, 9, 4], (0, 3), 9),  # root -> 3 -> 7 (node 3, a leaf): bonus from row 4
        ([3, 8, 1, 2, 9, 4], (0,), 8),  # root -> 3, then 8 is no child: recovered 8
        ([0, 7, 1, 2, 9, 4], (), 0),  # no child of the root matches
        ([5, 7, 1, 2, 9, 4][:1] + [0, 0, 0, 0, 0], (1,), 0),  # root -> 5, its child 1 does not match argmax 0
    ],
)
def test_greedy_follows_the_longest_matching_path(argmax, accepted, next_token):
    verdict = verify_tree_greedy(GREEDY_TREE, one_hot_logits(argmax))
    assert verdict == TreeVerdict(accepted, next_token)


def test_greedy_on_an_empty_tree_is_the_argmax():
    empty = DraftTree.chain(torch.tensor([], dtype=torch.long))
    assert verify_tree_greedy(empty, one_hot_logits([4])) == TreeVerdict((), 4)


def test_greedy_on_chains_equals_the_chain_verifier():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(0, 5, (1,), generator=g))
        logits = torch.randn(n + 1, 3, generator=g, dtype=torch.float64)
        tokens = torch.randint(0, 3, (n,), generator=g)
        chain = verify_greedy(tokens, logits)
        verdict = verify_tree_greedy(DraftTree.chain(tokens), logits)
        assert (verdict.num_accepted, verdict.next_token) == (chain.num_accepted, chain.next_token)
        assert verdict.accepted_nodes == tuple(range(chain.num_accepted))


# ---------------------------------------------------------------- sampling, exact cases


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["sampled-chain", "point-mass-chain"])
def test_sampled_on_chains_equals_the_chain_verifier_with_the_same_generator(with_draft_probs):
    g = torch.Generator().manual_seed(1)
    for trial in range(300):
        n = int(torch.randint(0, 4, (1,), generator=g))
        target = torch.softmax(torch.randn(n + 1, 4, generator=g, dtype=torch.float64) * 2, -1)
        draft = torch.softmax(torch.randn(n, 4, generator=g, dtype=torch.float64) * 2, -1) if with_draft_probs else None
        if draft is not None:
            tokens = torch.multinomial(draft, 1, generator=g)[:, 0]
        else:
            tokens = torch.randint(0, 4, (n,), generator=g)
        chain = verify_sampled(tokens, draft, target, torch.Generator().manual_seed(trial))
        verdict = verify_tree_sampled(DraftTree.chain(tokens, draft), target, torch.Generator().manual_seed(trial))
        assert (verdict.num_accepted, verdict.next_token) == (chain.num_accepted, chain.next_token)


def test_distinct_children_skip_rejected_tokens_when_recovering():
    """Every DISTINCT child of the root rejected: the recovered token is never one of them."""
    target = rows([0.3, 0.3, 0.2, 0.2], [0.25] * 4, [0.25] * 4)
    t = tree([-1, -1], [0, 1])
    g = torch.Generator().manual_seed(0)
    verdicts = [verify_tree_sampled(t, target, g) for _ in range(300)]
    assert all(v.next_token in (2, 3) for v in verdicts if not v.accepted_nodes)
    assert {v.accepted_nodes for v in verdicts} == {(), (0,), (1,)}


def test_certain_target_accepts_its_child_and_zero_target_never_does():
    # rows: root, node 0, node 1, node 2
    target = rows([0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.5, 0.0])
    t = tree([-1, -1, 1], [0, 1, 2])  # child 0 has target prob 0, child 1 has 1, its child 2 is certain
    g = torch.Generator().manual_seed(0)
    verdicts = [verify_tree_sampled(t, target, g) for _ in range(100)]
    assert {v.accepted_nodes for v in verdicts} == {(1, 2)}
    assert {v.next_token for v in verdicts} == {0, 1}  # the bonus, from node 2's row


def test_residual_guard_when_rounding_leaves_no_mass():
    """A sampled sibling whose draft equals target_now up to rounding, rejected by a near-1 uniform, still recovers."""
    target = rows([0.25, 0.75], [0.5, 0.5], [0.5, 0.5])
    draft = rows([0.25 - 1e-12, 0.75 + 1e-12], [0.25 - 1e-12, 0.75 + 1e-12])
    t = tree([-1, -1], [1, 1], draft_probs=draft)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        v = verify_tree_sampled(t, target, g)
        assert v.next_token in (0, 1)
    # The rule itself: the residual of identical laws falls back to target_now instead of 0/0.
    assert torch.equal(try_sampled_child(target[0], target[0], 1, torch.tensor(1.0, dtype=torch.float64)), target[0])
    certain = rows([0.0, 1.0])[0]
    assert torch.equal(try_distinct_child(certain, None, 1, torch.tensor(1.0, dtype=torch.float64)), certain)


# ---------------------------------------------------------------- the law, by enumeration

VOCAB = 4


def random_law(prefix, seed, temperature=1.0):
    key = sum((t + 1) * 7**i for i, t in enumerate(prefix)) + 13 * len(prefix)  # a seed per prefix
    g = torch.Generator().manual_seed(seed * 100003 + key)
    probs = torch.softmax(torch.randn(VOCAB, generator=g, dtype=torch.float64) / temperature, -1)
    if sum(prefix) % 3 == 1:  # a few rows with a hole in the support
        probs[(len(prefix) + sum(prefix)) % VOCAB] = 0.0
        probs /= probs.sum()
    return probs


TARGET_LAWS: dict[tuple, torch.Tensor] = {}
DRAFT_LAWS: dict[tuple, torch.Tensor] = {}


def target_law(prefix):
    if prefix not in TARGET_LAWS:
        TARGET_LAWS[prefix] = random_law(prefix, seed=1)
    return TARGET_LAWS[prefix]


def draft_law(prefix):
    if prefix not in DRAFT_LAWS:
        DRAFT_LAWS[prefix] = random_law(prefix, seed=2, temperature=0.7)
    return DRAFT_LAWS[prefix]


class TreeBuilder:
    """Drafts a tree from a shape: per level, how many children each node gets and of which kind."""

    def __init__(self, name, levels):
        self.name, self.levels = name, levels  # levels: [(num_children, kind)] from the root down

    def __call__(self, g):
        tokens, parents, prefixes, probs, kinds = [], [], [()], [], [self.levels[0][1]]
        frontier = [(-1, ())]
        for level, (num_children, kind) in enumerate(self.levels):
            next_frontier = []
            for parent, prefix in frontier:
                law = draft_law(prefix)
                if kind == DISTINCT:
                    chosen = torch.topk(law, num_children).indices.tolist()
                else:
                    chosen = torch.multinomial(law, num_children, replacement=True, generator=g).tolist()
                for token in chosen:
                    tokens.append(token)
                    parents.append(parent)
                    probs.append(law)
                    prefixes.append(prefix + (token,))
                    child_kind = self.levels[level + 1][1] if level + 1 < len(self.levels) else DISTINCT
                    kinds.append(child_kind)
                    next_frontier.append((len(tokens) - 1, prefix + (token,)))
            frontier = next_frontier
        t = DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.stack(probs), tuple(kinds))
        target_probs = torch.stack([target_law(p) for p in prefixes])  # [num_nodes + 1, vocab]
        return t, target_probs

    @property
    def length(self):
        return len(self.levels) + 1  # emitted tokens of a fully accepted path, bonus included

    def __repr__(self):
        return self.name


TOPK = TreeBuilder("topk", [(3, DISTINCT), (2, DISTINCT)])
IID = TreeBuilder("iid", [(3, SAMPLED), (2, SAMPLED)])
MIXED = TreeBuilder("mixed", [(2, SAMPLED), (2, DISTINCT), (1, SAMPLED)])


def exact_law(length):
    law = {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        p = 1.0
        for i, token in enumerate(seq):
            p *= float(target_law(seq[:i])[token])
        if p > 0:
            law[seq] = p
    return law


def sample_sequences(builder, rules, num_samples, seed):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(num_samples):
        t, target_probs = builder(g)
        verdict = walk_tree(t, target_probs, g, *rules)
        seq = tuple(t.tokens[list(verdict.accepted_nodes)].tolist()) + (verdict.next_token,)
        while len(seq) < builder.length:  # the next steps of the decode loop: the target's own law
            seq += (int(torch.multinomial(target_law(seq), 1, generator=g)),)
        samples.append(seq)
    return samples


def distinct_no_renormalise(target_now, draft_row, token, uniform):
    """Planted bug: zero the rejected sibling but forget to renormalise before trying the next one."""
    if uniform < target_now[token]:
        return None
    residual = target_now.clone()
    residual[token] = 0.0
    return residual


def distinct_recover_from_target(target_now, draft_row, token, uniform):
    """Planted bug: after a rejected sibling keep the target row (the rejected token may come back)."""
    return None if uniform < target_now[token] else target_now


def sampled_recover_from_target(target_now, draft_row, token, uniform):
    """Planted bug: the classic one, resample from the target instead of the residual."""
    return None if uniform * draft_row[token] < target_now[token] else target_now


def sampled_no_renormalise(target_now, draft_row, token, uniform):
    """Planted bug: subtract the draft but forget to renormalise before trying the next sibling."""
    if uniform * draft_row[token] < target_now[token]:
        return None
    return (target_now - draft_row).clamp_min(0.0)


REAL = (try_distinct_child, try_sampled_child)
BUGS = {
    "distinct-no-renormalise": (distinct_no_renormalise, try_sampled_child),
    "distinct-recover-from-target": (distinct_recover_from_target, try_sampled_child),
    "sampled-recover-from-target": (try_distinct_child, sampled_recover_from_target),
    "sampled-no-renormalise": (try_distinct_child, sampled_no_renormalise),
}
NUM_SAMPLES = 3000  # measured: real rules p > 0.4, planted bugs p < 1e-10 (most < 1e-60)


@pytest.mark.parametrize("builder", [TOPK, IID, MIXED], ids=repr)
def test_tree_verifier_reproduces_the_target_law(builder):
    samples = sample_sequences(builder, REAL, NUM_SAMPLES, seed=0)
    assert law_pvalue(samples, exact_law(builder.length)) > 1e-3


@pytest.mark.parametrize(
    "builder, bug",
    [
        (TOPK, "distinct-no-renormalise"),
        (TOPK, "distinct-recover-from-target"),
        (MIXED, "distinct-no-renormalise"),
        (MIXED, "distinct-recover-from-target"),
        (IID, "sampled-recover-from-target"),
        (MIXED, "sampled-recover-from-target"),
    ],
    ids=lambda x: repr(x) if isinstance(x, TreeBuilder) else x,
)
def test_the_law_test_catches_planted_bugs(builder, bug):
    samples = sample_sequences(builder, BUGS[bug], NUM_SAMPLES, seed=0)
    assert law_pvalue(samples, exact_law(builder.length)) < 1e-6


# Hand-made laws where forgetting to renormalise the sampled residual shows (random laws hide it: its bias needs
# the draft to cover the residual's support unevenly). The root has three i.i.d. siblings drawn from DRAFT_ROW.
TARGET_ROW = [0.4, 0.1, 0.1, 0.4]
DRAFT_ROW = [0.1, 0.7, 0.0, 0.2]


def first_token_samples(rules, num_samples, seed):
    g = torch.Generator().manual_seed(seed)
    draft = rows(DRAFT_ROW)[0]
    target_probs = torch.cat([rows(TARGET_ROW), torch.full((3, VOCAB), 1 / VOCAB, dtype=torch.float64)])
    samples = []
    for _ in range(num_samples):
        tokens = torch.multinomial(draft, 3, replacement=True, generator=g)
        kinds = (SAMPLED, DISTINCT, DISTINCT, DISTINCT)
        t = DraftTree(tokens, torch.tensor([-1, -1, -1]), draft.expand(3, VOCAB), kinds)
        verdict = walk_tree(t, target_probs, g, *rules)
        samples.append((int(tokens[verdict.accepted_nodes[0]]) if verdict.accepted_nodes else verdict.next_token,))
    return samples


@pytest.mark.parametrize("bug", [None, "sampled-no-renormalise", "sampled-recover-from-target"])
def test_iid_siblings_first_token_law_and_its_planted_bugs(bug):
    samples = first_token_samples(BUGS[bug] if bug else REAL, NUM_SAMPLES, seed=0)
    law = {(t,): p for t, p in enumerate(TARGET_ROW)}
    pvalue = law_pvalue(samples, law)
    assert pvalue < 1e-6 if bug else pvalue > 1e-3
