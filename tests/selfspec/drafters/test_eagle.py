"""EAGLE drafts through the engine: greedy output equals `model.generate`, sampled output has the model's law (also
with a truncated draft vocabulary), and the head's own cache is rolled back by length like the main one."""
import pytest
import torch

import selfspec.drafters.base
import selfspec.engine
from heads import draft_vocab as draft_vocabulary
from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.sampling import SamplingConfig
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model
from tests.heads.published_eagle import published_config, write_published
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue
from tests.selfspec.exercised import assert_exercised
from training import features as feature_data
from training import head_data
from training.recipes import EagleRecipe, Teacher


def trained_head(model, draft_vocab: torch.Tensor | int | None = None, steps=60, seed=0, layout="selfspec",
                 feature_layers: tuple[int, ...] = ()) -> EagleHead:
    """An EAGLE head of `layout` reading `feature_layers` beside the final state (EAGLE-3), trained for a few seconds
    on the model's own greedy continuations: right often, not always. `draft_vocab` an int N: the N tokens most
    frequent in those continuations (a draft vocabulary they leave at times, which drafts then cannot follow)."""
    torch.manual_seed(seed)
    target = TargetModel(model)
    target.set_feature_layers(feature_layers)
    prompts = torch.randint(3, target.vocab_size, (24, 4), generator=torch.Generator().manual_seed(seed))
    rows = list(head_data.continue_tokens(model, prompts, 28))
    if isinstance(draft_vocab, int):
        draft_vocab = draft_vocabulary.most_frequent(rows, target.vocab_size, draft_vocab)
    stream = feature_data.PositionStream(feature_data.compute_records(target, rows, progress=False))
    head = EagleHead.for_model(model, draft_vocab=draft_vocab, layout=layout, feature_layers=feature_layers)
    recipe = EagleRecipe(passes=2, layout=layout, feature_layers=feature_layers)
    teacher = Teacher(target, head.draft_vocab)  # an "eagle3" head holds its draft vocabulary in ascending order
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = stream.batch(stream.window_starts(8, 24, generator), 24)
        loss, _ = recipe.loss(head, batch, teacher)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return head.eval()


def sharp(model, factor=8.0):
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)  # confident next-token distributions: greedy continuations have structure
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("num_draft_tokens", [1, 3])
def test_greedy_eagle_equals_generate(family, num_draft_tokens):
    model = sharp(tiny_model(family))
    head = trained_head(model)
    spec = SelfSpecModel(model, heads=head)
    assert spec.drafter.__class__.__name__ == "EagleDrafter"  # chosen from the heads' kind
    assert_greedy_equals_generate(model, spec, f"eagle {family} k={num_draft_tokens}", num_draft_tokens)


def test_greedy_with_a_published_eagle1_head_equals_generate(tmp_path):
    """A head in the published EAGLE-1 layout, written as SafeAILab/EAGLE ships one (pytorch_model.bin with fc.weight,
    layers.0.* and the base's embed_tokens; a Llama config.json) and loaded from that directory, drafts through the
    engine on the post-norm features it already passes: greedy output equals `generate`, drafts are accepted, and the
    loaded head drafts exactly as the head it was written from (same drafted and accepted counts).
    Planted bug it caught: a loader reading fc's halves in the 'selfspec' order (feature first); drafts were still
    accepted now and then, so only the comparison with the original head caught it."""
    model = sharp(tiny_model())
    trained = trained_head(model, layout="eagle1")
    weights = {"fc.weight": trained.fuse.weight.detach(), "embed_tokens.weight": model.get_input_embeddings().weight,
               **{f"layers.{k}": v for k, v in trained.layers.state_dict().items()}}
    write_published(tmp_path, weights, published_config(model, bias=False))
    head = EagleHead.from_pretrained(tmp_path, model=model)
    assert head.config.layout == "eagle1" and not head.config.fuse_bias
    spec, original = SelfSpecModel(model, heads=head), SelfSpecModel(model, heads=trained)
    assert spec.drafter.__class__.__name__ == "EagleDrafter"
    stats = []
    for seed in range(3):
        prompt = random_prompt(8, seed=seed)
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences, plain), seed
        same = original.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[]).stats
        assert (out.stats.drafted, out.stats.accepted) == (same.drafted, same.accepted), seed
        stats.append(out.stats)
    assert_exercised(stats, what="published EAGLE-1 head")


def frequent_tokens(model, size=24) -> torch.Tensor:
    """[size] ids: the tokens the model's own greedy continuation of a random prompt uses most (a draft vocabulary)."""
    prompts = random_prompt(8, seed=0)
    greedy_ids = model.generate(prompts, max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=0)[0]
    return torch.bincount(greedy_ids, minlength=96).argsort(descending=True)[:size]


def assert_greedy_equals_generate(model, spec, what: str, num_draft_tokens: int = 3) -> None:
    """Three random prompts, 40 tokens each, `num_draft_tokens` drafts a step: spec's greedy output is the model's,
    with drafts proposed, some accepted and some rejected."""
    stats = []
    for seed in range(3):
        prompt = random_prompt(8, seed=seed)
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=num_draft_tokens, eos_token_id=[])
        assert torch.equal(out.sequences, plain), (what, seed)
        stats.append(out.stats)
    assert_exercised(stats, what=what)


def test_greedy_eagle_with_a_draft_vocabulary_equals_generate():
    """Drafts only from 24 of 96 tokens: the target's argmax outside them is simply a rejection."""
    model = sharp(tiny_model())
    draft_vocab = frequent_tokens(model)
    spec = SelfSpecModel(model, heads=trained_head(model, draft_vocab=draft_vocab))
    assert_greedy_equals_generate(model, spec, "eagle with a draft vocabulary")


@pytest.mark.parametrize("tree_size", [None, 6], ids=["chain", "tree-6"])
def test_draft_vocab_full_drafts_beyond_the_heads_vocabulary_and_equals_generate(tree_size):
    """draft_vocab="full": the same head's features projected onto every LM head row; drafts then include tokens
    outside its draft vocabulary, and greedy output stays the model's."""
    model = sharp(tiny_model())
    draft_vocab = frequent_tokens(model)
    spec = SelfSpecModel(model, heads=trained_head(model, draft_vocab=draft_vocab), tree_size=tree_size,
                         draft_vocab="full")
    assert spec.drafter.projected_vocab is None
    drafted, propose = [], spec.drafter.propose

    def recording(context):
        draft = propose(context)
        drafted.extend(draft.tokens.tolist())
        return draft

    spec.drafter.propose = recording
    assert_greedy_equals_generate(model, spec, "eagle over the full vocabulary")
    assert set(drafted) - set(draft_vocab.tolist()), "every draft stayed inside the head's draft vocabulary"


def test_draft_vocab_takes_head_full_or_auto():
    model = tiny_model()
    with pytest.raises(ValueError, match="'head'.*'full'.*'auto'.*got 'all'"):
        SelfSpecModel(model, heads=EagleHead.for_model(model), draft_vocab="all")


def test_draft_vocab_auto_keeps_the_heads_on_a_cpu_and_projects_onto_every_token_elsewhere():
    """The default, "auto": on a CPU the head's draft vocabulary (the whole vocabulary's projection costs more than it
    gains there), on an accelerator the whole vocabulary (a few rows' projection, more tokens per forward). Catches
    (planted): "auto" read as "full" everywhere; the device ignored."""
    from selfspec.drafters.eagle import resolve_draft_vocab

    model = tiny_model()
    draft_vocab = frequent_tokens(model)
    spec = SelfSpecModel(model, heads=EagleHead.for_model(model, draft_vocab=draft_vocab))
    assert torch.equal(spec.drafter.projected_vocab, draft_vocab)
    assert resolve_draft_vocab("auto", torch.device("cpu")) == "head"
    assert resolve_draft_vocab("auto", torch.device("cuda", 0)) == "full"
    assert resolve_draft_vocab("head", "cuda") == "head" and resolve_draft_vocab("full", "cpu") == "full"


def test_the_head_cache_holds_one_entry_per_committed_position():
    """Rollback by length: after each proposal the head's cache holds exactly the committed positions plus the
    entries it drafted on predicted features, which the next proposal cuts before rewriting them."""
    model = sharp(tiny_model())
    spec = SelfSpecModel(model, heads=trained_head(model))
    drafter = spec.drafter
    lengths = []
    original = drafter.propose

    def propose(context):
        draft = original(context)
        assert drafter._real_entries == drafter._real_length  # (no probe: every position read)
        lengths.append((drafter._real_length, drafter._cache.length, context.token_ids.shape[0],
                        draft.num_draft_tokens))
        return draft

    drafter.propose = propose
    spec.generate(random_prompt(8), max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    assert lengths
    for real, cached, num_tokens, num_drafted in lengths:
        assert real == num_tokens - 1  # every committed position (the pending token's predecessor included)
        assert cached == real + max(num_drafted - 1, 0)  # plus the drafted entries (the last draft is never fed)


class GapsThenProbes:
    """A draft-length policy: `gap` steps at k = 0, then a probe (one token, scored in shadow), then `burst` steps
    drafting `k` (verified), over and over; records each step's outcome."""

    def __init__(self, gap: int, burst: int, k: int):
        self.gap, self.burst, self.k, self.step, self.observed = gap, burst, k, 0, []

    def _phase(self) -> int:
        return self.step % (self.gap + 1 + self.burst)

    def probe_in_shadow(self, full_forward=True) -> bool:
        return self._phase() == self.gap

    def choose(self) -> int:
        phase = self._phase()
        return 0 if phase < self.gap else 1 if phase == self.gap else self.k

    def observe(self, num_drafted, num_accepted, seconds=None, **_):
        self.observed.append((self.probe_in_shadow(), num_drafted, num_accepted))
        self.step += 1


@pytest.mark.parametrize("tree_size", [None, 6])
def test_probes_read_at_most_the_newest_unseen_states_and_output_stays_greedy(tree_size):
    """After PROBE_CATCH_UP + 4 steps at k = 0 a probe has the head read only the newest PROBE_CATCH_UP states (the
    first probe: of the prompt too), leaving a gap of unread positions in its cache; drafting after it, chains or
    trees, still gives generate's greedy output, its drafts partly accepted."""
    from selfspec.drafters.eagle import PROBE_CATCH_UP

    model = sharp(tiny_model())
    spec = SelfSpecModel(model, heads=trained_head(model), tree_size=tree_size)
    drafter, read = spec.drafter, []
    original = drafter.propose

    def propose(context):
        entries_before = drafter._real_entries if context.token_ids.shape[0] - context.hidden_states.shape[0] > 1 else 0
        draft = original(context)
        read.append((context.probe, context.hidden_states.shape[0], drafter._real_entries - entries_before,
                     drafter._real_length - drafter._real_entries))
        return draft

    drafter.propose = propose
    policy = GapsThenProbes(gap=PROBE_CATCH_UP + 4, burst=5, k=3)
    prompt = random_prompt(30, seed=2)
    plain = model.generate(prompt, max_new_tokens=140, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = spec.generate(prompt, max_new_tokens=140, num_draft_tokens=policy, eos_token_id=[])
    assert torch.equal(out.sequences, plain)
    assert_exercised([out.stats], what="eagle drafting after capped probes")
    probes = [r for r in read if r[0]]
    assert len(probes) >= 3 and all(unseen > PROBE_CATCH_UP for _, unseen, _, _ in probes)
    assert all(entries == PROBE_CATCH_UP for _, _, entries, _ in probes)  # the newest states only
    assert all(unseen == entries for probe, unseen, entries, _ in read if not probe)  # drafting reads every state
    assert read[-1][3] == sum(unseen - PROBE_CATCH_UP for _, unseen, _, _ in probes)  # positions never read


VOCAB, NUM_NEW, NUM_SAMPLES = 4, 4, 1500
PROMPT = torch.tensor([[3, 1, 2, 3, 1]])


def randomized_head(model, draft_vocab=None, seed=1, layout="selfspec", feature_layers: tuple[int, ...] = ()):
    """A fresh head of `layout` with every parameter moved at random (a law test's drafts then differ from the model's
    law), reading `feature_layers` beside the final state."""
    head = EagleHead.for_model(model, draft_vocab=draft_vocab, layout=layout, feature_layers=feature_layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


def law_samples(spec, sampling, accepts_everything=False, what="eagle law"):
    """Unseeded samples (rejection sampling on torch's global generator, seeded once here)."""
    torch.manual_seed(0)
    samples, stats = [], []
    for _ in range(NUM_SAMPLES):
        out = spec.generate(PROMPT, max_new_tokens=NUM_NEW, do_sample=True, temperature=sampling.temperature,
                            top_k=sampling.top_k, top_p=sampling.top_p, num_draft_tokens=2, eos_token_id=[])
        samples.append(tuple(out.sequences[0, PROMPT.shape[1]:].tolist()))
        stats.append(out.stats)
    assert_exercised(stats, rejected=not accepts_everything, what=what)  # a planted bug below accepts everything
    return samples


@pytest.mark.parametrize("draft_vocab", [None, torch.tensor([2, 0])], ids=["full", "draft-vocab-2-of-4"])
def test_sampled_eagle_follows_the_model_law(draft_vocab):
    model = law_model()
    spec = SelfSpecModel(model, heads=randomized_head(model, draft_vocab))
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    law = exact_continuation_law(model, PROMPT, NUM_NEW, sampling)
    assert law_pvalue(law_samples(spec, sampling), law) > 1e-3


def misplaced_probs(draft_vocab_probs, draft_vocab, vocab_size):
    """Planted bug: draft-vocabulary probabilities written at ids 0..N-1 instead of at the draft vocabulary's ids."""
    full = draft_vocab_probs.new_zeros((*draft_vocab_probs.shape[:-1], vocab_size))
    full[..., : draft_vocab_probs.shape[-1]] = draft_vocab_probs
    return full


def test_the_law_test_catches_misplaced_draft_vocabulary_probabilities(monkeypatch):
    model = law_model()
    spec = SelfSpecModel(model, heads=randomized_head(model, torch.tensor([2, 3])))
    monkeypatch.setattr(selfspec.drafters.base, "full_vocab_probs", misplaced_probs)
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    # The engine's draft check refuses these drafts at once (each drafted token has draft probability 0)...
    with pytest.raises(ValueError, match="EagleDrafter drafted a token its draft_probs give probability 0"):
        spec.generate(PROMPT, max_new_tokens=NUM_NEW, do_sample=True, temperature=0.9, num_draft_tokens=2)
    monkeypatch.setattr(selfspec.engine, "check_drafts", lambda drafts, contexts, drafter: None)  # ...the law test too
    law = exact_continuation_law(model, PROMPT, NUM_NEW, sampling)
    assert law_pvalue(law_samples(spec, sampling, accepts_everything=True), law) < 1e-6
