"""Seeded sampling keyed by position (`selfspec/seeded.py`): the noise is a function of (seed, position) alone, a keyed
draw has the warped target's law, and with a seed the engine returns the tokens of `drafter="none"` with that seed,
whatever the drafter, chain or tree, fixed k or "auto", and the sampling's temperature, top-k or top-p; sampled over
many seeds, those tokens follow the model's law (enumerated), and planted bugs are caught.
"""
import pytest
import torch

import selfspec.sampling
import selfspec.seeded
import selfspec.sampler
from selfspec import SelfSpecModel
from selfspec.sampling import SamplingConfig, keyed_tokens, logits_to_probs
from selfspec.seeded import PositionNoise, keyed_noise
from selfspec.verifier import Verdict
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.drafters.test_eagle import frequent_tokens, randomized_head, sharp, trained_head
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue, randomized_medusa
from tests.selfspec.exercised import assert_exercised, greedy_sequences, scrambled_model, sharpened, trained_heads
from tests.selfspec.scripted_time import scripted_engine_clock
from tests.selfspec.test_engine_sampling import PROMPT, engine_samples

WARPINGS = {
    "t0.8": SamplingConfig(do_sample=True, temperature=0.8),
    "t0.7-topk5": SamplingConfig(do_sample=True, temperature=0.7, top_k=5),
    "topp0.8": SamplingConfig(do_sample=True, top_p=0.8),
}


def options_of(sampling: SamplingConfig) -> dict:
    return dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)


# --- the noise --------------------------------------------------------------------------------------------------

def test_noise_depends_on_the_seed_and_position_only():
    """Asked in any order, evicted and asked again, the same (seed, position) gives the same noise; another seed or
    position gives other noise."""
    forward, backward = PositionNoise(3, 50, "cpu", keep=2), PositionNoise(3, 50, "cpu", keep=64)
    in_order = [forward.gumbel(p).clone() for p in range(10)]
    reversed_order = [backward.gumbel(p).clone() for p in reversed(range(10))][::-1]
    assert all(torch.equal(a, b) for a, b in zip(in_order, reversed_order))
    assert torch.equal(forward.gumbel(0), in_order[0])  # evicted (keep=2), regenerated alike
    assert not torch.equal(in_order[0], in_order[1])
    assert not torch.equal(PositionNoise(4, 50, "cpu").gumbel(0), in_order[0])
    assert in_order[0].dtype == torch.float64 and bool(torch.isfinite(in_order[0]).all())


def test_a_generator_gives_one_seed_per_call():
    generator = torch.Generator().manual_seed(5)
    first = keyed_noise(None, generator, 10, "cpu")
    second = keyed_noise(None, generator, 10, "cpu")
    again = keyed_noise(None, torch.Generator().manual_seed(5), 10, "cpu")
    assert first.seed == again.seed != second.seed
    assert keyed_noise(None, None, 10, "cpu") is None and keyed_noise(7, None, 10, "cpu").seed == 7


# --- the law of a keyed draw ------------------------------------------------------------------------------------

LOGITS = torch.tensor([1.2, 0.3, -0.4, 2.0, 0.0, -1.5], dtype=torch.float64)


def keyed_pvalue(sampling: SamplingConfig, probs: torch.Tensor | None = None, num_seeds: int = 3000) -> float:
    """Chi-square p-value of the keyed draws at positions 4 and 5 over many seeds against the product of the warped
    law (`probs`, by default computed here) with itself: the two positions' tokens must be independent, each with the
    target's law."""
    probs = logits_to_probs(LOGITS, sampling) if probs is None else probs
    samples = []
    for seed in range(num_seeds):
        noise = PositionNoise(seed, LOGITS.shape[0], "cpu")
        samples.append(tuple(int(keyed_tokens(LOGITS, sampling, noise, p)[0]) for p in (4, 5)))
    law = {(a, b): float(probs[a] * probs[b]) for a in range(6) for b in range(6) if probs[a] * probs[b] > 0}
    if any(sample not in law for sample in samples):
        return 0.0  # a draw the warped law gives probability 0
    return law_pvalue(samples, law)


@pytest.mark.parametrize("name", list(WARPINGS))
def test_keyed_draws_have_the_warped_law_and_positions_are_independent(name):
    assert keyed_pvalue(WARPINGS[name]) > 1e-3


def test_the_keyed_law_test_catches_noise_shared_between_positions(monkeypatch):
    """Planted: every position reads position 0's noise (the draws at 4 and 5 are then always equal)."""
    original = PositionNoise.gumbel
    monkeypatch.setattr(PositionNoise, "gumbel", lambda self, position: original(self, 0))
    assert keyed_pvalue(WARPINGS["t0.8"]) < 1e-6


def test_the_keyed_law_test_catches_noise_added_before_warping(monkeypatch):
    """Planted: the noise added to the raw logits (the temperature and top-k ignored)."""
    law = logits_to_probs(LOGITS, WARPINGS["t0.7-topk5"])
    monkeypatch.setattr(selfspec.sampling, "warp_logits", lambda rows, sampling: rows)
    assert keyed_pvalue(WARPINGS["t0.7-topk5"], law) < 1e-6


# --- the same tokens as speculation off -------------------------------------------------------------------------

ENGINES = ["ngram", "medusa chain", "medusa tree", "eagle chain", "eagle tree", "eagle draft-vocab chain",
           "eagle draft-vocab tree", "early exit"]


def seeded_engine(name: str):
    """(SelfSpecModel, prompt) for a drafter as a chain or a tree, on a tiny float64 model where its drafts are right
    often and wrong often."""
    if name == "ngram":
        return SelfSpecModel(sharpened(tiny_model("llama"), 8.0), drafter="ngram"), repetitive_prompt(20, seed=2)
    if name.startswith("medusa"):
        model = scrambled_model("llama")
        prompts = [random_prompt(9, seed=1), repetitive_prompt(20, seed=2)]
        heads = trained_heads(model, greedy_sequences(model, prompts, 40))
        tree_size = 8 if name.endswith("tree") else None
        return SelfSpecModel(model, heads=heads, min_draft_confidence=0.0, tree_size=tree_size), prompts[1]
    if name.startswith("eagle"):  # (a draft vocabulary: the head drafts among the model's 24 most frequent tokens)
        model = sharp(tiny_model("llama"))
        tree_size = 8 if name.endswith("tree") else None
        draft_vocab = frequent_tokens(model) if "draft-vocab" in name else None
        head = trained_head(model, draft_vocab=draft_vocab, steps=40)
        return SelfSpecModel(model, heads=head, tree_size=tree_size), random_prompt(9, seed=1)
    model = sharpened(scrambled_model("llama", num_layers=4, seed=1), 4.0)
    return SelfSpecModel(model, drafter="early_exit", exit_layer=2), random_prompt(9, seed=1)


class CyclingLength:
    """A draft-length policy that asks 0, 1, 2, 3, 4, 0, ... draft tokens in turn: k changes every step."""

    def __init__(self):
        self.steps = 0

    def probe_in_shadow(self, full_forward=True) -> bool:
        return False

    def choose(self) -> int:
        self.steps += 1
        return self.steps % 5

    def observe(self, num_drafted, num_accepted, seconds=None):
        pass


def assert_seeded_tokens_equal_speculation_off(name: str, num_draft_tokens) -> None:
    spec, prompt = seeded_engine(name)
    if num_draft_tokens == "auto":  # a device where verifying costs little more than a decode: "auto" drafts
        scripted_engine_clock(spec, lambda num_tokens: 0.01 * (1 + 0.01 * num_tokens))
    plain = SelfSpecModel(spec.model, drafter="none")
    stats = []
    for sampling in WARPINGS.values():
        for seed in range(4):
            options = dict(max_new_tokens=24, seed=seed, eos_token_id=[], **options_of(sampling))
            k = CyclingLength() if num_draft_tokens == "cycling" else num_draft_tokens
            out = spec.generate(prompt, num_draft_tokens=k, **options)
            expected = plain.generate(prompt, **options).sequences
            assert torch.equal(out.sequences, expected), (name, sampling, seed)
            stats.append(out.stats)
    assert_exercised(stats, what=f"seeded {name}, num_draft_tokens={num_draft_tokens}")


@pytest.mark.parametrize("num_draft_tokens", [3, "cycling", "auto"])
@pytest.mark.parametrize("name", ENGINES)
def test_seeded_tokens_equal_speculation_off_with_the_same_seed(name, num_draft_tokens):
    """For each warping and seed, the drafter's tokens equal `drafter="none"`'s with that seed, at a fixed k, at a k
    that changes every step, and with "auto" (timed on a scripted device where drafting pays), and drafts were
    proposed, some accepted and some rejected along the way (summed over the runs). ("auto" prices early exit by its
    prior alone, which declines on a tiny model: the cycling k covers it.)"""
    if name == "early exit" and num_draft_tokens == "auto":
        pytest.skip("early exit's 'auto' declines to draft on a tiny model (priced by its prior, not by timings)")
    assert_seeded_tokens_equal_speculation_off(name, num_draft_tokens)


def test_seeded_batch_rows_equal_speculation_off_alone_with_their_row_seeds():
    """seed=s in a batch: row i's tokens are those of its prompt alone under drafter="none" with seed s + i (batches
    draft chains)."""
    spec, _ = seeded_engine("eagle chain")
    prompts = [random_prompt(9, seed=1)[0], repetitive_prompt(20, seed=2)[0], random_prompt(4, seed=3)[0]]
    options = dict(max_new_tokens=20, eos_token_id=[], **options_of(WARPINGS["t0.7-topk5"]))
    out = spec.generate(prompts, seed=11, num_draft_tokens=3, **options)
    plain = SelfSpecModel(spec.model, drafter="none")
    for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
        assert torch.equal(got, plain.generate(prompt[None], seed=11 + i, **options).sequences[0]), i
    assert_exercised(out.row_stats, what="seeded batch, eagle chain")


def accept_all(draft_tokens, target_logits, sampling, noise, first_position):
    """Planted bug: the keyed verifier keeps every draft (and draws the bonus token after them)."""
    n = draft_tokens.shape[0]
    return Verdict(n, int(keyed_tokens(target_logits[n], sampling, noise, first_position + n)[0]))


def test_the_identity_test_catches_a_verifier_that_accepts_every_draft(monkeypatch):
    monkeypatch.setattr(selfspec.sampler, "verify_keyed", accept_all)
    with pytest.raises(AssertionError):
        assert_seeded_tokens_equal_speculation_off("eagle chain", 3)


# --- the law over many seeds, through the engine ----------------------------------------------------------------

def law_engine(kind: str):
    model = law_model()
    if kind == "medusa chain":
        return model, SelfSpecModel(model, heads=randomized_medusa(model), tree_size=None)
    if kind == "eagle tree":
        return model, SelfSpecModel(model, heads=randomized_head(model), tree_size=5, min_draft_confidence=0.0)
    return model, SelfSpecModel(model, drafter="ngram")


@pytest.mark.parametrize("kind, name", [("medusa chain", "t0.7-topk5"), ("medusa chain", "topp0.8"),
                                        ("eagle tree", "t0.8"), ("ngram", "t0.8")])
def test_seeded_samples_over_many_seeds_follow_the_model_law(kind, name):
    model, spec = law_engine(kind)
    sampling = WARPINGS[name]
    law = exact_continuation_law(model, PROMPT, 4, sampling)
    samples, _ = engine_samples(spec, sampling, keyed=True)  # one seed per call; asserts it was exercised
    assert law_pvalue(samples, law) > 1e-3


def test_the_seeded_law_test_catches_a_verifier_that_accepts_every_draft(monkeypatch):
    monkeypatch.setattr(selfspec.sampler, "verify_keyed", accept_all)
    model, spec = law_engine("medusa chain")
    sampling = WARPINGS["t0.8"]
    law = exact_continuation_law(model, PROMPT, 4, sampling)
    samples, _ = engine_samples(spec, sampling, keyed=True, exercised=False)
    assert law_pvalue(samples, law) < 1e-6
