"""EAGLE-3 drafts (an EAGLE head with `feature_layers`) through the engine: the target hands the drafter its final
state and the named layers' states, greedy output equals `model.generate` (chain, tree, a batch) and sampled output
has the model's law for heads of either layout ("selfspec": the base's LM head scores; "eagle3", the speculators
format's: its own LM head over a draft vocabulary), and the drafts are exactly those of the head run naively on the
base's own hidden_states. What only the "eagle3" layout has is in test_eagle3_layout.py."""
import functools

import pytest
import torch

import selfspec.drafters.eagle
import selfspec.target
from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.drafters.eagle import EagleDrafter
from selfspec.sampling import SamplingConfig
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model
from tests.selfspec.drafters.test_eagle import (NUM_NEW, PROMPT, assert_greedy_equals_generate, law_samples,
                                                randomized_head, sharp, trained_head)
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue
from tests.selfspec.exercised import assert_exercised, totals

LAYERS = (1, 2, 3)  # of a 4-layer tiny model: hidden_states 1, 2 and 3 beside the final state (vLLM's EAGLE-3 reads 3)
LAYOUTS = ("selfspec", "eagle3")  # the base's LM head over the whole vocabulary; its own LM head over a draft vocabulary
DRAFT_VOCAB_SIZE = 48  # an "eagle3" head's, of 96: greedy continuations leave it at times, which drafts cannot follow


@functools.cache
def model_and_trained_head(layout: str) -> tuple:
    """A sharp 4-layer tiny model and an EAGLE-3 head of `layout` reading LAYERS, trained on the model's own greedy
    continuations (an "eagle3" head over the DRAFT_VOCAB_SIZE tokens most frequent in them). Built once a test run:
    test_eagle3_layout.py drafts with the same "eagle3" head."""
    model = sharp(tiny_model(num_layers=4))
    draft_vocab = DRAFT_VOCAB_SIZE if layout == "eagle3" else None
    return model, trained_head(model, draft_vocab, layout=layout, feature_layers=LAYERS)


@pytest.fixture(scope="module")
def model_and_head():
    return model_and_trained_head("selfspec")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tree_size", [None, 6], ids=["chain", "tree-6"])
def test_greedy_eagle3_equals_generate(layout, tree_size, monkeypatch):
    model, head = model_and_trained_head(layout)
    spec = SelfSpecModel(model, heads=head, tree_size=tree_size)
    assert spec.target.feature_layers == LAYERS  # set by the engine from the drafter
    # an "eagle3" head drafts over its draft vocabulary with its own LM head: nothing is projected through the base's
    assert spec.drafter.projected_vocab is None and (spec.drafter.draft_vocab is not None) == (layout == "eagle3")
    scored = []
    original = EagleHead.draft_logits
    monkeypatch.setattr(EagleHead, "draft_logits", lambda self, *a: scored.append(1) or original(self, *a))
    trees = []
    original_tree = EagleDrafter._draft_tree
    monkeypatch.setattr(EagleDrafter, "_draft_tree", lambda self, *a: trees.append(1) or original_tree(self, *a))
    assert_greedy_equals_generate(model, spec, f"eagle3 {layout} layout tree_size={tree_size}")
    assert scored and bool(trees) == bool(tree_size)  # the paths named were taken


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_eagle3_batch_equals_each_rows_generate(layout):
    model, head = model_and_trained_head(layout)
    spec = SelfSpecModel(model, heads=head)
    prompts = [random_prompt(n, seed=s)[0] for s, n in ((0, 8), (1, 5), (2, 11))]
    out = spec.generate(prompts, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    for prompt, sequence in zip(prompts, out.sequences):
        plain = model.generate(prompt[None], max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(sequence, plain[0])
    assert_exercised([out.stats], what=f"eagle3 {layout} layout batch")


def reference_counts(model, head, sequence: torch.Tensor, prompt_length: int) -> tuple[int, int]:
    """(drafted, accepted) of greedy chains of one draft, worked out naively: one plain forward over the final
    sequence gives every position's [final; hidden_states[l]...] rows, the head reads them all at once (causal), and
    its guess at position p - 1 is the draft for token p + 1 when p is pending (none when p + 1 is the last token:
    the engine drafts no further than the tokens asked for)."""
    with torch.no_grad():
        out = model.get_decoder()(input_ids=sequence[None], output_hidden_states=True)
        rows = torch.cat([out.last_hidden_state] + [out.hidden_states[l] for l in head.config.feature_layers], -1)
        embed = model.get_input_embeddings()(sequence[None, 1:])
        predicted = head(rows[:, :-1], embed, torch.arange(len(sequence) - 1)[None])[0]
        guesses = model.lm_head(predicted).argmax(-1)  # guesses[t]: token t + 2
    drafted = accepted = 0
    pending = prompt_length
    while pending + 2 < len(sequence):
        drafted += 1
        if int(guesses[pending - 1]) == int(sequence[pending + 1]):
            accepted += 1
            pending += 2
        else:
            pending += 1
    return drafted, accepted


def wrong_feature_layers(self, layers):
    """Planted bug: the target hands the drafter hidden_states[l + 1] (mod the layers) where the head reads layer l."""
    self.feature_layers = tuple((int(l) + 1) % self.num_layers for l in layers)


@pytest.mark.parametrize("planted_bug", [False, True], ids=["right-layers", "planted-wrong-layer"])
def test_drafts_are_the_heads_guesses_on_the_bases_own_layers(model_and_head, planted_bug, monkeypatch):
    """Greedy output stays exact whatever the drafts are, so this checks the drafts themselves: the engine's drafted
    and accepted counts equal a naive reference's. The planted bug (features of the wrong layer) must break that."""
    model, head = model_and_head
    if planted_bug:
        monkeypatch.setattr(selfspec.target.TargetModel, "set_feature_layers", wrong_feature_layers)
    spec = SelfSpecModel(model, heads=head, tree_size=None)
    mismatches, stats = 0, []
    for seed in range(4):
        prompt = random_prompt(8, seed=seed)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=1, eos_token_id=[])
        stats.append(out.stats)
        mismatches += totals(out.stats) != reference_counts(model, head, out.sequences[0], prompt.shape[1])
    assert_exercised(stats, what="eagle3 reference")
    assert (mismatches > 0) == planted_bug, mismatches


def misreported_draw(real_draw):
    """Planted bug: the drafts are drawn from the head's law, but the draft_probs reported are uniform over the draft
    vocabulary (still zero outside it and positive at every drafted token, so only the law can tell)."""
    def draw(logits, context, draft_vocab=None, depth=0):
        tokens, probs = real_draw(logits, context, draft_vocab, depth)
        if probs is not None:
            probs = torch.zeros_like(probs).index_fill_(-1, draft_vocab, 1.0 / len(draft_vocab))
        return tokens, probs
    return draw


@pytest.mark.parametrize("layout, draft_vocab, planted_bug", [("selfspec", None, False), ("eagle3", [3, 0, 2], False),
                                                              ("eagle3", [3, 0, 2], True)],
                         ids=["selfspec", "eagle3", "eagle3-planted-misreported-draft-probs"])
def test_sampled_eagle3_follows_the_model_law(layout, draft_vocab, planted_bug, monkeypatch):
    """One-layer law model: the head reads its final state and hidden_states[0] (the embedding); an "eagle3" head
    drafts among 3 of its 4 tokens, with draft probabilities that must be the law its drafts were drawn from."""
    model = law_model()
    if planted_bug:
        monkeypatch.setattr(selfspec.drafters.eagle, "draw_draft", misreported_draw(selfspec.drafters.eagle.draw_draft))
    draft_vocab = None if draft_vocab is None else torch.tensor(draft_vocab)
    spec = SelfSpecModel(model, heads=randomized_head(model, draft_vocab, layout=layout, feature_layers=(0,)))
    assert spec.target.feature_layers == (0,)
    if draft_vocab is not None:
        assert spec.drafter.draft_vocab.tolist() == sorted(draft_vocab.tolist())  # ascending, as "eagle3" holds it
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    law = exact_continuation_law(model, PROMPT, NUM_NEW, sampling)
    samples = law_samples(spec, sampling, what=f"eagle3 {layout} layout law")
    assert (law_pvalue(samples, law) > 1e-3) != planted_bug


def test_feature_layers_beyond_the_base_and_early_exit_resumes_are_refused(model_and_head):
    model, head = model_and_head
    with pytest.raises(ValueError, match="lie beyond it"):  # a base of 2 layers has hidden_states 0..1 only
        head.check_base(tiny_model(num_layers=2), check_identity=False)
    with pytest.raises(ValueError, match="lie beyond it"):
        TargetModel(tiny_model(num_layers=2)).set_feature_layers(LAYERS)
    target = TargetModel(model)
    target.set_feature_layers(LAYERS)
    with pytest.raises(NotImplementedError, match="early exit"):
        target.forward(torch.tensor([3, 4]), target.new_cache(), start_layer=1, start_hidden=torch.zeros(2, 32))
    with pytest.raises(ValueError, match="width"):
        head(torch.zeros(1, 2, 40, dtype=torch.float64), torch.zeros(1, 2, 32, dtype=torch.float64),
             torch.arange(2)[None])
