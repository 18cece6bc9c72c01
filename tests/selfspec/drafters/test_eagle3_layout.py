"""EAGLE heads of the "eagle3" layout (the speculators format's EAGLE-3: fc over the feature layers, layer 0 over
[norm(embedding); norm(hidden)], its own LM head over a draft vocabulary) through the one EAGLE drafter: greedy output
equals `model.generate` (chain, tree, a batch), sampled output has the model's law with draft probabilities that are
the law drafts were drawn from (zero outside the draft vocabulary), and a head that went through the speculators
format drafts exactly as before."""
import pytest
import torch

import selfspec.drafters.eagle
from heads import draft_vocab as draft_vocabulary
from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.drafters.base import DraftContext
from selfspec.drafters.eagle import EagleDrafter
from selfspec.sampling import SamplingConfig
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model
from tests.selfspec.drafters.test_eagle import NUM_NEW, NUM_SAMPLES, PROMPT, sharp
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue
from tests.selfspec.exercised import assert_exercised
from training import features as feature_data
from training import head_data
from training.recipes import EagleRecipe, Teacher

LAYERS = (1, 2)  # of a 4-layer tiny model
DRAFT_VOCAB_SIZE = 48  # of 96: greedy continuations leave it at times, which drafts then cannot follow


def trained_eagle3_layout_head(model, steps=60, seed=0) -> EagleHead:
    """An "eagle3" head over the DRAFT_VOCAB_SIZE tokens most frequent in the model's own greedy continuations,
    trained for a few seconds on them (its own LM head too): right often, not always."""
    torch.manual_seed(seed)
    target = TargetModel(model)
    target.set_feature_layers(LAYERS)
    prompts = torch.randint(3, target.vocab_size, (24, 4), generator=torch.Generator().manual_seed(seed))
    rows = list(head_data.continue_tokens(model, prompts, 28))
    draft_vocab = draft_vocabulary.most_frequent(rows, target.vocab_size, DRAFT_VOCAB_SIZE)
    stream = feature_data.PositionStream(feature_data.compute_records(target, rows, progress=False))
    head = EagleHead.for_model(model, draft_vocab=draft_vocab, layout="eagle3", feature_layers=LAYERS)
    recipe, teacher = EagleRecipe(passes=2, layout="eagle3", feature_layers=LAYERS), Teacher(target, head.draft_vocab)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = stream.batch(stream.window_starts(8, 24, generator), 24)
        loss, _ = recipe.loss(head, batch, teacher)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return head.eval()


@pytest.fixture(scope="module")
def model_and_head():
    model = sharp(tiny_model(num_layers=4))
    return model, trained_eagle3_layout_head(model)


@pytest.mark.parametrize("tree_size", [None, 6], ids=["chain", "tree-6"])
def test_greedy_eagle3_layout_equals_generate(model_and_head, tree_size, monkeypatch):
    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head, tree_size=tree_size)
    assert spec.target.feature_layers == LAYERS and spec.drafter.projected_vocab is None  # its own LM head
    scored = []
    original = EagleHead.draft_logits
    monkeypatch.setattr(EagleHead, "draft_logits", lambda self, *a: scored.append(1) or original(self, *a))
    trees = []
    original_tree = EagleDrafter._draft_tree
    monkeypatch.setattr(EagleDrafter, "_draft_tree", lambda self, *a: trees.append(1) or original_tree(self, *a))
    stats = []
    for seed in range(3):
        prompt = random_prompt(8, seed=seed)
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences, plain), seed
        stats.append(out.stats)
    assert_exercised(stats, what=f"eagle3 layout tree_size={tree_size}")
    assert scored and bool(trees) == bool(tree_size)  # the paths named were taken


def test_greedy_eagle3_layout_batch_equals_each_rows_generate(model_and_head):
    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head)
    prompts = [random_prompt(n, seed=s)[0] for s, n in ((0, 8), (1, 5), (2, 11))]
    out = spec.generate(prompts, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    for prompt, sequence in zip(prompts, out.sequences):
        plain = model.generate(prompt[None], max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(sequence, plain[0])
    assert_exercised([out.stats], what="eagle3 layout batch")


def test_a_head_through_the_speculators_format_drafts_the_same(model_and_head, tmp_path):
    model, head = model_and_head
    head.save_pretrained(tmp_path, format="speculators", model=model)
    loaded = EagleHead.from_pretrained(tmp_path, model=model)
    outputs = []
    for drafting in (head, loaded):
        spec = SelfSpecModel(model, heads=drafting, tree_size=None)
        outputs.append([spec.generate(random_prompt(8, seed=s), max_new_tokens=30, num_draft_tokens=3,
                                      eos_token_id=[]) for s in range(2)])
    for before, after in zip(*outputs):
        assert torch.equal(before.sequences, after.sequences)
        assert (before.stats.drafted, before.stats.accepted) == (after.stats.drafted, after.stats.accepted)
    assert_exercised([o.stats for o in outputs[1]], what="eagle3 layout from the speculators format")


def test_draft_probs_are_zero_outside_the_draft_vocabulary_and_full_is_refused(model_and_head):
    model, head = model_and_head
    target = TargetModel(model)
    target.set_feature_layers(LAYERS)
    drafter = EagleDrafter(target, head)
    tokens = random_prompt(8)[0]
    cache = target.new_cache()
    with torch.no_grad():
        hidden = target.forward(tokens[:-1], cache)  # [7, 3H] the committed positions; the last token is pending
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    context = DraftContext(token_ids=tokens, hidden_state=hidden[-1], hidden_states=hidden, num_draft_tokens=3,
                           sampling=sampling, generator=torch.Generator().manual_seed(0), target=target, cache=cache)
    with torch.no_grad():  # as the engine drafts
        draft = drafter.propose(context)
    assert draft.num_draft_tokens == 3 and torch.isin(draft.tokens, head.draft_vocab).all()
    outside = torch.ones(target.vocab_size, dtype=torch.bool).index_fill_(0, head.draft_vocab, False)
    assert float(draft.probs[:, outside].abs().max()) == 0.0
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(3, dtype=draft.probs.dtype))
    with pytest.raises(ValueError, match="cannot draft over the whole vocabulary"):
        EagleDrafter(target, head, draft_vocab="full")


def randomized_eagle3_layout_head(model, seed=1):
    """An "eagle3" head reading hidden_states[0] of the one-layer law model, drafting among 3 of its 4 tokens."""
    head = EagleHead.for_model(model, draft_vocab=torch.tensor([3, 0, 2]), layout="eagle3", feature_layers=(0,))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


def misreported_draw(real_draw):
    """Planted bug: the drafts are drawn from the head's law, but the draft_probs reported are uniform over the draft
    vocabulary (still zero outside it and positive at every drafted token, so only the law can tell)."""
    def draw(logits, context, draft_vocab=None, depth=0):
        tokens, probs = real_draw(logits, context, draft_vocab, depth)
        if probs is not None:
            probs = torch.zeros_like(probs).index_fill_(-1, draft_vocab, 1.0 / len(draft_vocab))
        return tokens, probs
    return draw


@pytest.mark.parametrize("planted_bug", [False, True], ids=["exact", "planted-misreported-draft-probs"])
def test_sampled_eagle3_layout_follows_the_model_law(planted_bug, monkeypatch):
    model = law_model()
    head = randomized_eagle3_layout_head(model)
    if planted_bug:
        monkeypatch.setattr(selfspec.drafters.eagle, "draw_draft", misreported_draw(selfspec.drafters.eagle.draw_draft))
    spec = SelfSpecModel(model, heads=head)
    assert spec.target.feature_layers == (0,) and spec.drafter.draft_vocab.tolist() == [0, 2, 3]
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    law = exact_continuation_law(model, PROMPT, NUM_NEW, sampling)
    torch.manual_seed(0)
    samples, stats = [], []
    for _ in range(NUM_SAMPLES):
        out = spec.generate(PROMPT, max_new_tokens=NUM_NEW, do_sample=True, temperature=0.9, num_draft_tokens=2,
                            eos_token_id=[])
        samples.append(tuple(out.sequences[0, PROMPT.shape[1]:].tolist()))
        stats.append(out.stats)
    assert_exercised(stats, what="eagle3 layout law")
    assert (law_pvalue(samples, law) > 1e-3) != planted_bug
