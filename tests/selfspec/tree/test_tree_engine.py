"""Tree drafts through the engine (`SelfSpecModel(..., tree_size=N)`): greedy output equals `model.generate` with
Medusa and EAGLE trees, sampled output has the model's law (and a planted verifier bug is caught), the caches hold the
accepted path only, and wrap time refuses what has no tree path.

Every test asserts, through a spy on the engine's tree verifier, that the path it names was taken: trees with
several branches, a non-first sibling accepted, nodes rejected.
"""
import pytest
import torch
from transformers import AttentionInterface

import selfspec.sampler
from heads import EagleHead, MedusaHeads
from selfspec import SelfSpecModel
from selfspec.cache_layer import SPARE_COLUMNS
from selfspec.drafters.base import Draft, DraftContext
from selfspec.tree.forward import resolve_min_node_probability, resolve_tree_size
from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig
from selfspec.tree.verifier import try_sampled_child, walk_tree
from tests.conftest import random_prompt, tiny_model
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue
from tests.selfspec.exactness import randomized_medusa as shared_randomized_medusa
from tests.selfspec.exercised import assert_exercised, greedy_sequences, trained_heads
from tests.selfspec.drafters.test_eagle import randomized_head, sharp, trained_head
from tests.selfspec.tree.test_forward import causal_only_attention
from tests.selfspec.tree.test_verifier import distinct_no_renormalise


class TreeSpy:
    """Records (tree, verdict) of every tree step the engine verifies, passing them through unchanged."""

    def __init__(self, monkeypatch):
        self.steps = []
        for name in ("verify_tree_greedy", "verify_tree_sampled"):
            monkeypatch.setattr(selfspec.sampler, name, self._recording(getattr(selfspec.sampler, name)))

    def _recording(self, verify):
        def spy(tree, *args):
            verdict = verify(tree, *args)
            self.steps.append((tree, verdict))
            return verdict
        return spy

    def assert_exercised(self, what: str) -> None:
        """Trees with more than one branch were verified, a non-first sibling was accepted, some nodes rejected."""
        assert self.steps, f"no tree was verified ({what})"
        branchy = sum(any(len(c) > 1 for c in tree.children) for tree, _ in self.steps)
        later_sibling = sum(
            any(tree.children[int(tree.parents[node]) + 1][0] != node for node in verdict.accepted_nodes)
            for tree, verdict in self.steps
        )
        nodes = sum(tree.num_nodes for tree, _ in self.steps)
        accepted = sum(verdict.num_accepted for _, verdict in self.steps)
        assert branchy > 0, f"every tree was a chain ({what})"
        assert later_sibling > 0, f"no sibling after the first was ever accepted ({what})"
        assert 0 < accepted < nodes, f"accepted {accepted} of {nodes} nodes ({what})"


def medusa_model_and_heads(family):
    model = sharp(tiny_model(family))
    prompts = [random_prompt(8, seed=seed) for seed in range(4)]
    return model, trained_heads(model, greedy_sequences(model, prompts, 40)), prompts


@pytest.mark.parametrize("family, floor", [("llama", 0.0), ("qwen2", 0.0), ("llama", 0.05)])
def test_greedy_medusa_trees_equal_generate(family, floor, monkeypatch):
    model, heads, prompts = medusa_model_and_heads(family)
    spec = SelfSpecModel(model, heads=heads, tree_size=8, min_draft_confidence=0.0)
    spec.min_node_probability = floor  # ("auto" trees on a CPU with the few-row kernel set one)
    spy = TreeSpy(monkeypatch)
    stats = []
    for prompt in prompts:
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences, plain), family
        stats.append(out.stats)
    assert_exercised(stats, what=f"medusa trees {family}")
    spy.assert_exercised(f"medusa trees {family}")


@pytest.mark.parametrize("family, floor", [("llama", 0.0), ("qwen2", 0.0), ("llama", 0.05)])
def test_greedy_eagle_trees_equal_generate(family, floor, monkeypatch):
    model = sharp(tiny_model(family))
    spec = SelfSpecModel(model, heads=trained_head(model), tree_size=8)
    spec.min_node_probability = floor
    spy = TreeSpy(monkeypatch)
    stats = []
    for seed in range(3):
        prompt = random_prompt(8, seed=seed)
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences, plain), (family, seed)
        stats.append(out.stats)
    assert_exercised(stats, what=f"eagle trees {family}")
    spy.assert_exercised(f"eagle trees {family}")


def test_eagle_tree_children_are_the_top_tokens_of_their_path():
    """The head's tree forward (4D mask, positions by depth) gives each node the feature a chain along its path would:
    recomputed one token at a time on a fresh head cache, each node's children are the top tokens, in order."""
    model = sharp(tiny_model())
    spec = SelfSpecModel(model, heads=trained_head(model), tree_size=30, tree_top_k=4)  # most of 4 + 16 + 16
    with torch.no_grad():
        check_children_along_paths(spec)


@pytest.mark.parametrize("tree_size, tree_top_k, width", [(10, "auto", 4), (30, "auto", 8), (30, 3, 3)])
def test_eagle_tree_top_k_auto_widens_with_the_node_budget(tree_size, tree_top_k, width):
    """tree_top_k="auto" (the default): 4 for a CPU's small trees, N / 4 (at most 20) for larger ones (`auto_top_k`); a
    count given is kept. The tree's first level holds exactly that many children of the root, and its depth-2 level
    that many children under each of that many parents. Catches (planted): "auto" fixed at 4; a count given ignored."""
    from selfspec.drafters.eagle import auto_top_k

    assert [auto_top_k(n) for n in (1, 10, 16, 17, 47, 128, 256)] == [4, 4, 4, 4, 12, 20, 20]
    model = sharp(tiny_model())
    spec = SelfSpecModel(model, heads=trained_head(model), tree_size=tree_size, tree_top_k=tree_top_k)
    assert spec.drafter.top_k(tree_size) == width
    with torch.no_grad():
        first = spec.drafter.propose(first_tree_context(spec, seed=2, num_draft_tokens=1)).tree()
        assert first.num_nodes == width == len(first.children[0])
        tree = spec.drafter.propose(first_tree_context(spec, seed=2, num_draft_tokens=2)).tree()
    parents = [row for row in range(1, tree.num_nodes + 1) if tree.children[row]]
    assert tree.num_nodes == min(tree_size, width + width * width)
    assert len(parents) <= width and all(len(tree.children[row]) <= width for row in parents)


def test_eagle_tree_top_k_refuses_what_is_not_auto_or_a_count():
    model = tiny_model()
    with pytest.raises(ValueError, match=r'tree_top_k \("auto" or a count\) must be an integer >= 1, got \'wide\''):
        SelfSpecModel(model, heads=EagleHead.for_model(model), tree_size=10, tree_top_k="wide")


def first_tree_context(spec, seed: int, num_draft_tokens: int) -> DraftContext:
    """The greedy context of the first proposal after a random 8-token prompt: its real features, the pending token
    (the model's argmax), at most `num_draft_tokens` levels of `spec.tree_size` nodes."""
    target, prompt = spec.target, random_prompt(8, seed=seed)[0]
    hidden = target.forward(prompt, target.new_cache())  # [T, hidden]
    tokens = torch.cat([prompt, target.logits(hidden[-1:]).argmax(-1)])  # the prompt + the pending token
    return DraftContext(tokens, hidden[-1], hidden, num_draft_tokens, Sampler(SamplingConfig()), target,
                        target.new_cache(), tree_size=spec.tree_size)


def check_children_along_paths(spec):
    drafter, target = spec.drafter, spec.target
    context = first_tree_context(spec, seed=5, num_draft_tokens=3)
    hidden, tokens = context.hidden_states, context.token_ids
    tree = drafter.propose(context).tree()
    assert any(len(c) > 1 for c in tree.children[1:]), "some node below the root must branch"
    assert int(tree.depths.max()) == 3
    for row, children in enumerate(tree.children):
        if children:
            feature = chain_feature(drafter, hidden, tokens, tree.tokens[tree.path_to(row - 1)])
            ranked = target.logits(feature).argsort(descending=True).tolist()
            got = tree.tokens[list(children)].tolist()
            width = drafter.top_k(spec.tree_size)
            assert got == [t for t in ranked if t in got] and set(got) <= set(ranked[:width]), row


def test_eagle_trees_skip_only_nodes_that_could_not_be_kept(monkeypatch):
    """A node scoring no more than the N-th best candidate so far is not expanded (`tree_select.frontier`'s floor):
    the trees are exactly those drafted expanding every frontier node, for fewer head forwards."""
    import selfspec.drafters.eagle as eagle

    model = sharp(tiny_model())
    head = trained_head(model)
    floored, forwards = eagle.frontier, []
    head_forward = head.forward
    monkeypatch.setattr(head, "forward", lambda *a, **k: forwards.append(1) or head_forward(*a, **k))

    def draft(spec, seed, floor):
        unfloored = lambda ids, scores, width, _: floored(ids, scores, width)  # noqa: E731
        monkeypatch.setattr(eagle, "frontier", floored if floor else unfloored)
        context = first_tree_context(spec, seed, num_draft_tokens=5)
        forwards.clear()
        proposal = spec.drafter.propose(context)
        return proposal.tokens, proposal.parents, len(forwards)

    saved = 0
    with torch.no_grad():
        for tree_size in (3, 6, 12):
            spec = SelfSpecModel(model, heads=head, tree_size=tree_size)
            for seed in range(4):
                tokens, parents, num_forwards = draft(spec, seed, floor=True)
                all_tokens, all_parents, all_forwards = draft(spec, seed, floor=False)
                assert torch.equal(tokens, all_tokens) and torch.equal(parents, all_parents), (tree_size, seed)
                assert num_forwards <= all_forwards
                saved += all_forwards - num_forwards
    assert saved > 0, "some level must have been left undrafted"


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_a_node_floor_drops_exactly_the_nodes_at_or_below_it(drafter, monkeypatch):
    """With `DraftContext.min_node_probability` p a drafted tree is the tree drafted without it in the same context,
    less its nodes of cumulative draft probability <= p (the last ones, most probable first), so no kept node loses
    its parent and no node above p is lost. Catches (planted): the floor ignored by the drafter (nothing dropped)."""
    from dataclasses import replace

    from selfspec.tree import select as tree_select

    kept_scores, best = [], tree_select.TreeCandidates.best

    def recording(self, budget, floor=-torch.inf):  # the scores of the nodes `best` keeps, most probable first
        scores = torch.cat(self._scores)
        kept_scores.append(scores[tree_select.kept(scores, budget, floor)])
        return best(self, budget, floor)

    monkeypatch.setattr(tree_select.TreeCandidates, "best", recording)
    if drafter == "eagle":
        model = sharp(tiny_model())
        spec = SelfSpecModel(model, heads=trained_head(model), tree_size=12)
    else:
        model, heads, _ = medusa_model_and_heads("llama")
        spec = SelfSpecModel(model, heads=heads, tree_size=12, min_draft_confidence=0.0)
    dropped = kept_some = 0
    with torch.no_grad():
        for seed in range(6):
            context = first_tree_context(spec, seed, num_draft_tokens=3)
            whole = spec.drafter.propose(context)
            scores = kept_scores[-1]
            floor = float(scores[len(scores) // 2].exp())  # the median node's probability: about half are dropped
            floored = spec.drafter.propose(replace(context, min_node_probability=floor))
            above = int((scores > torch.log(torch.tensor(floor))).sum())
            assert torch.equal(floored.tokens, whole.tokens[:above]), (drafter, seed)
            assert torch.equal(floored.parents, whole.parents[:above]), (drafter, seed)
            dropped += whole.tokens.numel() - above
            kept_some += above > 1
    assert dropped > 0 and kept_some > 0


def chain_feature(drafter, hidden, tokens, path):
    """[hidden] the head's predicted feature after `path` [d], run as a chain (one token per forward, causal mask) on
    a fresh cache: real features for the prompt [T], then its own predictions."""
    head, embed = drafter.head, drafter.embed
    cache, num_real = head.new_cache(), hidden.shape[0]
    feature = head(hidden[None], embed(tokens[1:])[None], torch.arange(num_real)[None], cache)[0, -1:]
    for depth, token in enumerate(path.tolist()):
        position = torch.full((1, 1), num_real + depth)
        feature = head(feature[None], embed(torch.tensor([token]))[None], position, cache)[0]
    return feature[0]


VOCAB, NUM_NEW, NUM_SAMPLES = 4, 4, 1500
PROMPT = torch.tensor([[3, 1, 2, 3, 1]])
SAMPLING = SamplingConfig(do_sample=True, temperature=0.9)


def randomized_medusa(model, seed=1):
    return shared_randomized_medusa(model, seed)


def tree_law_samples(spec, num_samples: int = NUM_SAMPLES):
    """Unseeded samples (rejection sampling on torch's global generator, seeded once here)."""
    torch.manual_seed(0)
    samples, stats = [], []
    for _ in range(num_samples):
        out = spec.generate(PROMPT, max_new_tokens=NUM_NEW, do_sample=True, temperature=SAMPLING.temperature,
                            num_draft_tokens=2, eos_token_id=[])
        samples.append(tuple(out.sequences[0, PROMPT.shape[1]:].tolist()))
        stats.append(out.stats)
    return samples, stats


def law_spec(drafter):
    model = law_model()
    heads = randomized_medusa(model) if drafter == "medusa" else randomized_head(model)
    return model, SelfSpecModel(model, heads=heads, tree_size=5, min_draft_confidence=0.0)


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_sampled_trees_follow_the_model_law(drafter, monkeypatch):
    model, spec = law_spec(drafter)
    spy = TreeSpy(monkeypatch)
    samples, stats = tree_law_samples(spec)
    assert_exercised(stats, what=f"{drafter} tree law")
    spy.assert_exercised(f"{drafter} tree law")
    assert law_pvalue(samples, exact_continuation_law(model, PROMPT, NUM_NEW, SAMPLING)) > 1e-3


def test_the_tree_law_test_catches_a_verifier_that_skips_renormalising(monkeypatch):
    model, spec = law_spec("medusa")

    def skip_renormalising(tree, target_probs, generator=None):
        return walk_tree(tree, target_probs, generator, distinct_no_renormalise, try_sampled_child)

    monkeypatch.setattr(selfspec.sampler, "verify_tree_sampled", skip_renormalising)
    # Twice the samples of the law test: the bias is small (p ~ 3e-6 at 1,500 samples with one random stream), and
    # the catch must not hang on the stream's luck.
    samples, stats = tree_law_samples(spec, 2 * NUM_SAMPLES)
    assert_exercised(stats, what="planted tree verifier bug")
    assert law_pvalue(samples, exact_continuation_law(model, PROMPT, NUM_NEW, SAMPLING)) < 1e-6


def test_caches_hold_the_accepted_path_only(monkeypatch):
    """Over 150 tokens the main cache never holds more than the sequence plus one tree (and the in-place layers' spare
    columns), and the EAGLE head's cache never more than its committed entries plus one proposal's tree entries."""
    model = sharp(tiny_model()).float()
    spec = SelfSpecModel(model, heads=trained_head(model), tree_size=10)
    drafter, excess = spec.drafter, []
    propose = drafter.propose

    def recording(context):
        draft = propose(context)
        excess.append(drafter._cache.length - drafter._real_entries)
        assert drafter._real_length == context.token_ids.shape[0] - 1
        return draft

    monkeypatch.setattr(drafter, "propose", recording)
    spy = TreeSpy(monkeypatch)
    prompt = random_prompt(8, seed=1)
    stats = spec.generate(prompt, max_new_tokens=150, num_draft_tokens=4, eos_token_id=[]).stats
    assert_exercised(stats, what="tree memory")
    assert len(spy.steps) > 20
    per_token = 2 * 2 * 2 * 8 * 4  # layers * (keys, values) * KV heads * head dim * float32 bytes
    assert stats.peak_cache_bytes <= (8 + 150 - 1 + 10 + 1 + SPARE_COLUMNS) * per_token  # + one tree's slack
    width = drafter.top_k(spec.tree_size)
    assert 0 < max(excess) <= width * 3  # depths 1..3 expanded, `width` nodes each: cut by the next proposal


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_auto_prices_a_tree_step_by_the_most_nodes_it_can_hold(drafter, monkeypatch):
    """`max_tree_nodes(depth, N)` bounds every tree the drafter builds at that depth cap (and is reached), and the
    engine hands it to the "auto" policy for tree wrappers only. Catches (planted): a bound one short (EAGLE's
    k + (depth - 1) k instead of k + (depth - 1) k^2 at N = 30); the engine not passing it."""
    import selfspec.engine

    if drafter == "eagle":
        model = sharp(tiny_model("llama"))
        heads = trained_head(model)
    else:
        model, heads, _ = medusa_model_and_heads("llama")
    spec = SelfSpecModel(model, heads=heads, tree_size=30, min_draft_confidence=0.0)
    spy = TreeSpy(monkeypatch)
    reached = set()
    for depth in (1, 2, 3):
        spy.steps.clear()
        spec.generate(random_prompt(8, seed=depth), max_new_tokens=12, num_draft_tokens=depth, eos_token_id=[])
        bound = spec.drafter.max_tree_nodes(depth, 30)
        assert spy.steps and all(tree.num_nodes <= bound for tree, _ in spy.steps)
        reached |= {depth for tree, _ in spy.steps if tree.num_nodes == bound}
    assert reached == {1, 2, 3}
    given = []
    original = selfspec.engine.draft_length_policy
    monkeypatch.setattr(selfspec.engine, "draft_length_policy", lambda *a, **kw: given.append(kw) or original(*a, **kw))
    spec.generate(random_prompt(8), max_new_tokens=4, eos_token_id=[])
    SelfSpecModel(model, heads=heads).generate(random_prompt(8), max_new_tokens=4, eos_token_id=[])
    assert given[0]["verified_tokens"](2) == spec.drafter.max_tree_nodes(2, 30) > 2
    assert "verified_tokens" not in given[1]


def test_auto_learns_the_nodes_each_tree_depth_verified(monkeypatch):
    """The engine tells an "auto" policy the nodes each tree step verified (`observe(depth, ..., verified=nodes)`),
    and tells it nothing of the kind for chains; a fixed draft length with trees takes no such argument. Catches
    (planted): the step's depth passed as its nodes, nodes withheld, nodes passed to a fixed policy (TypeError)."""
    from selfspec.draft_length.policy import AdaptiveDraftLength

    model = sharp(tiny_model("llama"))
    heads = trained_head(model)
    told, observe = [], AdaptiveDraftLength.observe

    def recording(self, depth, *args, **kwargs):  # (depth, nodes told or None) of every step the policy observes
        told.append((depth, kwargs.get("verified")))
        return observe(self, depth, *args, **kwargs)

    monkeypatch.setattr(AdaptiveDraftLength, "observe", recording)
    spy = TreeSpy(monkeypatch)
    spec = SelfSpecModel(model, heads=heads, tree_size=12)
    spec.generate(random_prompt(8, seed=5), max_new_tokens=24, eos_token_id=[])
    trees = [(tree.num_nodes, int(tree.depths.max())) for tree, _ in spy.steps]
    tree_steps = [(nodes, depth) for depth, nodes in told if nodes is not None]
    assert trees and tree_steps == trees
    assert any(nodes > depth for nodes, depth in trees)  # branches: the nodes are not the depth
    told.clear()
    SelfSpecModel(model, heads=heads).generate(random_prompt(8, seed=5), max_new_tokens=24, eos_token_id=[])
    assert told and all(nodes is None for _, nodes in told)
    spy.steps.clear()
    spec.generate(random_prompt(8, seed=5), max_new_tokens=12, num_draft_tokens=2, eos_token_id=[])
    assert spy.steps  # a fixed depth: verified, no TypeError


def test_chain_drafters_keep_proposing_chains_with_tree_size():
    """An explicit tree_size reaches every drafter (DraftContext.tree_size); n-gram ignores it and its chains are
    verified as before. "auto" (the default) gives trees only to drafters that set `auto_trees` (EAGLE)."""
    model = sharp(tiny_model())
    seen = []

    class Recording:
        def propose(self, context):
            seen.append(context.tree_size)
            return Draft(context.token_ids[-context.num_draft_tokens:].flip(0))

        def observe(self, num_drafted, num_accepted):
            pass

    spec = SelfSpecModel(model, drafter=Recording(), tree_size=6)
    assert spec.tree_size == 6 and spec.chain_reason is None
    prompt = random_prompt(8)
    plain = model.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(prompt, max_new_tokens=20, num_draft_tokens=2, eos_token_id=[]).sequences, plain)
    assert seen and set(seen) == {6}
    ngram = SelfSpecModel(model, drafter="ngram", tree_size=4)
    assert torch.equal(ngram.generate(prompt, max_new_tokens=20, num_draft_tokens=2, eos_token_id=[]).sequences, plain)
    assert SelfSpecModel(model, drafter="ngram", tree_size=0).tree_size == 0
    assert SelfSpecModel(model, drafter="ngram", tree_size=None).tree_size == 0


def kernel_cpu(monkeypatch):
    """Make "auto" see a CPU whose products run through the few-row kernel (where its trees were measured) for a
    float64 model, whose argmax numerical noise cannot flip."""
    import selfspec.tree.forward

    monkeypatch.setattr(selfspec.tree.forward, "_kernel_cpu", lambda device, few_row_kernel: True)


def test_auto_drafts_chains_where_trees_were_not_measured_or_cannot_be_built(monkeypatch):
    """The default, "auto", drafts chains on a CPU without the kernel, for drafters whose trees were not measured to
    pay (Medusa, n-gram, early exit, speculation off, a user's drafter without auto_trees) and for a model whose
    attention ignores a custom mask, each with its reason in chain_reason; an explicit size gives Medusa trees and is
    refused where "auto" falls back for the model."""
    model = sharp(tiny_model())
    head = trained_head(model)
    assert SelfSpecModel(model, heads=head).tree_size == 0  # float64: no few-row kernel
    assert "few-row kernel" in SelfSpecModel(model, heads=head).chain_reason
    kernel_cpu(monkeypatch)
    assert SelfSpecModel(model, heads=head).tree_size == 10 and SelfSpecModel(model, heads=head).chain_reason is None

    class UserDrafter:
        def propose(self, context):
            return Draft.empty(context.token_ids.device)

        def observe(self, num_drafted, num_accepted):
            pass

    medusa = MedusaHeads.for_model(model, num_heads=2)
    for drafter, options in (("medusa", {"heads": medusa}), ("ngram", {}), ("none", {}),
                             ("early_exit", {"exit_layer": 1}), (UserDrafter(), {})):
        spec = SelfSpecModel(model, drafter=drafter, **options)
        assert spec.tree_size == 0 and "auto_trees" in spec.chain_reason, drafter
    assert SelfSpecModel(model, drafter="medusa", heads=medusa, tree_size=6).tree_size == 6
    with pytest.raises(ValueError, match="early_exit"):
        SelfSpecModel(model, drafter="early_exit", exit_layer=1, tree_size=4)
    AttentionInterface.register("causal_only_for_test", causal_only_attention)
    blind = sharp(tiny_model(seed=1))
    blind.set_attn_implementation("causal_only_for_test")
    spec = SelfSpecModel(blind, heads=trained_head(blind))
    assert spec.tree_size == 0 and "custom 4D attention mask" in spec.chain_reason
    with pytest.raises(NotImplementedError, match="custom 4D attention mask"):
        SelfSpecModel(blind, heads=trained_head(blind), tree_size=4)


def test_auto_drafts_chains_where_the_tree_probe_fails_otherwise(monkeypatch):
    """A family whose tree forward raises something the probe does not translate (here an IndexError): "auto" keeps
    chains, saying why, rather than failing a wrapper that chains would run; an explicit size raises it."""
    import selfspec.tree.forward

    kernel_cpu(monkeypatch)

    def broken(*args, **kwargs):
        raise IndexError("no such layer")

    monkeypatch.setattr(selfspec.tree.forward, "tree_forward", broken)
    model = sharp(tiny_model(seed=2))
    spec = SelfSpecModel(model, heads=trained_head(model))
    assert spec.tree_size == 0 and "IndexError: no such layer" in spec.chain_reason
    prompt = random_prompt(8)
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(prompt, max_new_tokens=12, eos_token_id=[]).sequences, plain)
    with pytest.raises(IndexError):
        SelfSpecModel(model, heads=trained_head(model), tree_size=4)


def test_the_default_drafts_auto_trees_where_they_pay_and_stays_exact(monkeypatch):
    """Where "auto" drafts trees (a CPU with the kernel, simulated on a float64 model), a wrapper built with no
    tree_size verifies trees of 10 nodes above the 0.02 floor, and its greedy output is generate's token for token.
    Catches (planted, by hand): the default left at None (chains: the spy sees no tree)."""
    kernel_cpu(monkeypatch)
    model = sharp(tiny_model())
    spec = SelfSpecModel(model, heads=trained_head(model))
    assert (spec.tree_size, spec.min_node_probability) == (10, 0.02)
    spy = TreeSpy(monkeypatch)
    stats = []
    for seed in range(3):
        prompt = random_prompt(8, seed=seed)
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, eos_token_id=[])
        assert torch.equal(out.sequences, plain), seed
        stats.append(out.stats)
    assert_exercised(stats, what="default eagle trees")
    spy.assert_exercised("default eagle trees")


def test_auto_tree_size_with_the_few_row_kernel_is_the_measured_one():
    """On a CPU whose products run through the few-row kernel, "auto" is the size measured best there (10); on an
    accelerator the prior curve's budget; on a CPU without the kernel chains (0)."""
    assert resolve_tree_size("auto", "cpu", few_row_kernel=True) == 10
    assert resolve_tree_size("auto", "cpu", few_row_kernel=False) == 0
    assert resolve_tree_size("auto", "cuda", few_row_kernel=True) == resolve_tree_size("auto", "cuda") == 47
    assert resolve_tree_size(5, "cpu", few_row_kernel=True) == 5
    model = tiny_model(dtype=torch.float32)
    off = SelfSpecModel(model, heads=trained_head(model), few_row_kernel="off")
    assert off.tree_size == 0 and "few-row kernel" in off.chain_reason


@pytest.mark.usefixtures("needs_kernel")
def test_a_wrapper_with_the_few_row_kernel_passes_it_to_auto_tree_size():
    model = tiny_model(dtype=torch.float32)
    spec = SelfSpecModel(model, heads=trained_head(model))
    assert spec.few_row_kernel and spec.tree_size == 10 and spec.min_node_probability == 0.02
    assert SelfSpecModel(model, drafter="ngram").tree_size == 0


def test_auto_trees_with_the_few_row_kernel_keep_only_nodes_above_the_measured_floor():
    """On a CPU with the few-row kernel an "auto" tree keeps nodes of cumulative draft probability above 0.02 (each
    verified node costs ~0.03 decodes there); elsewhere, and for a tree size given, the N most probable."""
    assert resolve_min_node_probability("auto", "cpu", few_row_kernel=True) == 0.02
    assert resolve_min_node_probability("auto", "cpu", few_row_kernel=False) == 0.0
    assert resolve_min_node_probability("auto", "cuda", few_row_kernel=True) == 0.0
    assert resolve_min_node_probability(10, "cpu", few_row_kernel=True) == 0.0
    assert resolve_min_node_probability(None, "cpu", few_row_kernel=True) == 0.0


@pytest.mark.usefixtures("needs_kernel")
def test_the_node_floor_reaches_the_drafter():
    seen = []

    class Recording:
        def propose(self, context):
            seen.append((context.tree_size, context.min_node_probability))
            return Draft.empty(context.token_ids.device)

        def observe(self, num_drafted, num_accepted):
            pass

        auto_trees = True  # "auto" gives it trees

        def max_tree_nodes(self, depth, tree_size):
            return min(tree_size, 2 * depth)

    model = tiny_model(dtype=torch.float32)
    for tree_size, expected in (("auto", (10, 0.02)), (8, (8, 0.0))):
        seen.clear()
        SelfSpecModel(model, drafter=Recording(), tree_size=tree_size).generate(
            random_prompt(8), max_new_tokens=4, num_draft_tokens=2, eos_token_id=[])
        assert seen and set(seen) == {expected}, tree_size


class TreeOfTwo:
    """A user's drafter that proposes a tree (two DISTINCT children of the pending token)."""

    def propose(self, context):
        return Draft(torch.tensor([3, 4]), parents=torch.tensor([-1, -1]))

    def observe(self, num_drafted, num_accepted):
        pass


def test_a_tree_needs_tree_size_at_wrap_time():
    spec = SelfSpecModel(tiny_model(), drafter=TreeOfTwo())
    with pytest.raises(ValueError, match="wrapped without tree_size"):
        spec.generate(random_prompt(6), max_new_tokens=4, num_draft_tokens=1)
    SelfSpecModel(tiny_model(), drafter=TreeOfTwo(), tree_size=2).generate(random_prompt(6), max_new_tokens=4,
                                                                           num_draft_tokens=1)


@pytest.mark.parametrize("tree_size", [-1, "big", True, 2.5])
def test_tree_size_values_are_checked(tree_size):
    with pytest.raises(ValueError, match="tree_size must be"):
        SelfSpecModel(tiny_model(), drafter="ngram", tree_size=tree_size)


def test_early_exit_with_trees_is_refused_at_wrap_time():
    with pytest.raises(ValueError, match="early_exit"):
        SelfSpecModel(tiny_model(), drafter="early_exit", exit_layer=1, tree_size=4)


def test_attention_that_ignores_a_custom_mask_is_refused_at_wrap_time():
    AttentionInterface.register("causal_only_for_test", causal_only_attention)
    model = tiny_model()
    model.set_attn_implementation("causal_only_for_test")
    SelfSpecModel(model, drafter="ngram")  # chains need no custom mask
    with pytest.raises(NotImplementedError, match="custom 4D attention mask"):
        SelfSpecModel(model, drafter="ngram", tree_size=4)
