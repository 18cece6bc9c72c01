"""Sampled speculation has exactly the model's distribution: engine samples vs the law computed by enumeration.

The model has a 4-token vocabulary, so the law of a 4-token continuation (prefill, then one step verifying a
chain of 2 drafts, then whatever is left) has at most 256 outcomes and is computed exactly from full forwards under the same warpers. The same test fails for a planted verifier bug.
"""
import pytest
import torch

import selfspec.sampler
from selfspec import SelfSpecModel
from selfspec.sampling import SamplingConfig
from selfspec.verifier import Verdict, verify_sampled
from tests.selfspec.exactness import exact_continuation_law, law_model, law_pvalue, randomized_medusa
from tests.selfspec.exercised import assert_exercised

VOCAB, NUM_NEW, NUM_SAMPLES = 4, 4, 2000
PROMPT = torch.tensor([[3, 1, 2, 3, 1]])  # repeats, so the n-gram drafter proposes something


def sharp_model(seed=0):
    return law_model(seed)


def randomized_heads(model, seed=1):
    return randomized_medusa(model, seed)


def engine_samples(spec, sampling: SamplingConfig, num_draft_tokens=2, seed=0, num_samples=NUM_SAMPLES,
                   prompt=PROMPT, num_new=NUM_NEW, eos_token_id=(), stop_strings=None, exercised=True, keyed=False):
    """`num_samples` continuations; asserts (unless told not to) that drafts were proposed on most of them and that
    some were accepted and some rejected. Returns (samples, stats).

    keyed=False: unseeded calls (rejection sampling on torch's global generator, seeded once here); keyed=True: each
    call gets a torch.Generator, i.e. one fresh seed per call, and takes the position-keyed path."""
    generator = torch.Generator().manual_seed(seed) if keyed else None
    if not keyed:
        torch.manual_seed(seed)
    samples, stats = [], []
    for _ in range(num_samples):
        out = spec.generate(
            prompt, max_new_tokens=num_new, do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k,
            top_p=sampling.top_p, num_draft_tokens=num_draft_tokens, generator=generator, eos_token_id=list(eos_token_id),
            stop_strings=stop_strings,
        )
        samples.append(tuple(out.sequences[0, prompt.shape[1]:].tolist()))
        stats.append(out.stats)
    if exercised:
        assert sum(s.drafted for s in stats) > num_samples, "the drafter must propose tokens for this test to mean anything"
        assert_exercised(stats)
    return samples, stats


SAMPLINGS = {
    "t1": SamplingConfig(do_sample=True),
    "t0.7-topk3": SamplingConfig(do_sample=True, temperature=0.7, top_k=3),
    "topp0.8": SamplingConfig(do_sample=True, top_p=0.8),
}


@pytest.mark.parametrize(
    "drafter, name", [("medusa", "t1"), ("medusa", "t0.7-topk3"), ("medusa", "topp0.8"), ("ngram", "t1")]
)
def test_samples_follow_the_model_law(drafter, name):
    model = sharp_model()
    spec = SelfSpecModel(model, drafter=drafter, heads=randomized_heads(model) if drafter == "medusa" else None)
    law = exact_continuation_law(model, PROMPT, NUM_NEW, SAMPLINGS[name])
    assert law_pvalue(engine_samples(spec, SAMPLINGS[name])[0], law) > 1e-3


def resample_from_target(draft_tokens, draft_probs, target_probs, generator=None):
    """Planted bug: on rejection, sample from the target row instead of the residual."""
    verdict = verify_sampled(draft_tokens, draft_probs, target_probs, generator)
    if verdict.num_accepted == draft_tokens.shape[0]:
        return verdict
    return Verdict(verdict.num_accepted, int(torch.multinomial(target_probs[verdict.num_accepted], 1, generator=generator)))


def accept_always(draft_tokens, draft_probs, target_probs, generator=None):
    """Planted bug: accept every draft (a lossy 'typical acceptance' taken to the extreme)."""
    return Verdict(draft_tokens.shape[0], int(torch.multinomial(target_probs[-1], 1, generator=generator)))


@pytest.mark.parametrize("bug", [resample_from_target, accept_always])
def test_the_same_test_fails_for_a_planted_verifier_bug(monkeypatch, bug):
    model = sharp_model()
    spec = SelfSpecModel(model, heads=randomized_heads(model))
    monkeypatch.setattr(selfspec.sampler, "verify_sampled", bug)
    sampling = SAMPLINGS["t1"]
    law = exact_continuation_law(model, PROMPT, NUM_NEW, sampling)
    assert law_pvalue(engine_samples(spec, sampling, exercised=False)[0], law) < 1e-6
