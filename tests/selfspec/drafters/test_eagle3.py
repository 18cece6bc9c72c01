"""EAGLE-3 drafts (an EAGLE head with `feature_layers`) through the engine: the target hands the drafter its final
state and the named layers' states, greedy output equals `model.generate` (chain, tree, a batch), sampled output has
the model's law, and the drafts are exactly those of the head run naively on the base's own hidden_states."""
import pytest
import torch

import selfspec.target
from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.drafters.eagle import EagleDrafter
from selfspec.sampling import SamplingConfig
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model
from tests.selfspec.drafters.test_eagle import NUM_NEW, NUM_SAMPLES, PROMPT, sharp
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue
from tests.selfspec.exercised import assert_exercised, totals
from training import features as feature_data
from training import head_data
from training.recipes import EagleRecipe, Teacher

LAYERS = (1, 2)  # of a 4-layer tiny model: hidden_states 1 and 2, beside the final state


def trained_eagle3_head(model, layers=LAYERS, steps=60, seed=0) -> EagleHead:
    """An EAGLE-3 head trained for a few seconds on the model's own greedy continuations: right often, not always."""
    torch.manual_seed(seed)
    target = TargetModel(model)
    target.set_feature_layers(layers)
    prompts = torch.randint(3, target.vocab_size, (24, 4), generator=torch.Generator().manual_seed(seed))
    rows = list(head_data.continue_tokens(model, prompts, 28))
    stream = feature_data.PositionStream(feature_data.compute_records(target, rows, progress=False))
    head = EagleHead.for_model(model, feature_layers=layers)
    recipe, teacher = EagleRecipe(passes=2, feature_layers=layers), Teacher(target, None)
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
    return model, trained_eagle3_head(model)


@pytest.mark.parametrize("tree_size", [None, 6], ids=["chain", "tree-6"])
def test_greedy_eagle3_equals_generate(model_and_head, tree_size, monkeypatch):
    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head, tree_size=tree_size)
    assert spec.target.feature_layers == LAYERS  # set by the engine from the drafter
    trees = []
    original = EagleDrafter._draft_tree
    monkeypatch.setattr(EagleDrafter, "_draft_tree", lambda self, *a: trees.append(1) or original(self, *a))
    stats = []
    for seed in range(3):
        prompt = random_prompt(8, seed=seed)
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences, plain), seed
        stats.append(out.stats)
    assert_exercised(stats, what=f"eagle3 tree_size={tree_size}")
    assert bool(trees) == bool(tree_size)  # the path named was taken


def test_greedy_eagle3_batch_equals_each_rows_generate(model_and_head):
    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head)
    prompts = [random_prompt(n, seed=s)[0] for s, n in ((0, 8), (1, 5), (2, 11))]
    out = spec.generate(prompts, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    for prompt, sequence in zip(prompts, out.sequences):
        plain = model.generate(prompt[None], max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(sequence, plain[0])
    assert_exercised([out.stats], what="eagle3 batch")


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


def wrong_layer_states(self, out):
    """Planted bug: the target hands the drafter hidden_states[l + 1] where the head reads layer l."""
    if not self.feature_layers:
        return out.last_hidden_state
    return torch.cat([out.last_hidden_state] + [out.hidden_states[l + 1] for l in self.feature_layers], dim=-1)


@pytest.mark.parametrize("planted_bug", [False, True], ids=["right-layers", "planted-wrong-layer"])
def test_drafts_are_the_heads_guesses_on_the_bases_own_layers(model_and_head, planted_bug, monkeypatch):
    """Greedy output stays exact whatever the drafts are, so this checks the drafts themselves: the engine's drafted
    and accepted counts equal a naive reference's. The planted bug (features of the wrong layer) must break that."""
    model, head = model_and_head
    if planted_bug:
        monkeypatch.setattr(selfspec.target.TargetModel, "states", wrong_layer_states)
    spec = SelfSpecModel(model, heads=head, tree_size=None)
    mismatches, stats = 0, []
    for seed in range(4):
        prompt = random_prompt(8, seed=seed)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=1, eos_token_id=[])
        stats.append(out.stats)
        mismatches += totals(out.stats) != reference_counts(model, head, out.sequences[0], prompt.shape[1])
    assert_exercised(stats, what="eagle3 reference")
    assert (mismatches > 0) == planted_bug, mismatches


def randomized_eagle3_head(model, layers=(0,), seed=1):
    head = EagleHead.for_model(model, feature_layers=layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


def test_sampled_eagle3_follows_the_model_law():
    model = law_model()  # one layer: the head reads its final state and hidden_states[0] (the embedding)
    spec = SelfSpecModel(model, heads=randomized_eagle3_head(model))
    assert spec.target.feature_layers == (0,)
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    law = exact_continuation_law(model, PROMPT, NUM_NEW, sampling)
    torch.manual_seed(0)
    samples, stats = [], []
    for _ in range(NUM_SAMPLES):
        out = spec.generate(PROMPT, max_new_tokens=NUM_NEW, do_sample=True, temperature=0.9, num_draft_tokens=2,
                            eos_token_id=[])
        samples.append(tuple(out.sequences[0, PROMPT.shape[1]:].tolist()))
        stats.append(out.stats)
    assert_exercised(stats, what="eagle3 law")
    assert law_pvalue(samples, law) > 1e-3


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
