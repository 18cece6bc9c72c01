"""The request's Sampler: what generate's arguments make of it, and that each mode draws and verifies as the pure
functions it stands for (greedy argmax, keyed draws, rejection sampling from its generator)."""
import re
from pathlib import Path

import pytest
import torch

from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig, greedy_tokens, keyed_tokens
from selfspec.seeded import PositionNoise
from selfspec.verifier import verify_greedy, verify_keyed, verify_sampled

VOCAB = 50
SAMPLED = SamplingConfig(do_sample=True, temperature=0.8, top_k=20)


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_generates_arguments_choose_the_mode():
    assert Sampler.for_request(SamplingConfig(), None, None, VOCAB, "cpu").mode == "greedy"
    assert Sampler.for_request(SAMPLED, None, None, VOCAB, "cpu").mode == "rejection"
    keyed = Sampler.for_request(SAMPLED, 7, None, VOCAB, "cpu")
    assert keyed.mode == "keyed" and keyed.noise.seed == PositionNoise(7, VOCAB, "cpu").seed
    generator = torch.Generator().manual_seed(3)
    from_generator = Sampler.for_request(SAMPLED, None, generator, VOCAB, "cpu")  # one seed drawn per call
    assert from_generator.mode == "keyed"
    assert from_generator.noise.seed == PositionNoise.from_generator(torch.Generator().manual_seed(3), VOCAB,
                                                                     "cpu").seed
    assert Sampler.for_request(SamplingConfig(), 7, None, VOCAB, "cpu").mode == "greedy"  # greedy ignores a seed
    assert keyed.by_equality and not Sampler(SAMPLED).by_equality
    with pytest.raises(ValueError, match="not both"):
        Sampler(SAMPLED, noise=keyed.noise, generator=generator)


def test_each_mode_draws_as_its_function():
    scores = logits(3)
    tokens, probs = Sampler().draw(scores)
    assert torch.equal(tokens, greedy_tokens(scores)) and probs is None
    noise = PositionNoise(11, VOCAB, "cpu")
    tokens, probs = Sampler(SAMPLED, noise=noise).draw(scores, [4, 5, 6])
    assert torch.equal(tokens, keyed_tokens(scores, SAMPLED, noise, [4, 5, 6])) and probs is None
    first = Sampler(SAMPLED, generator=torch.Generator().manual_seed(5)).draw(scores)
    again = Sampler(SAMPLED, generator=torch.Generator().manual_seed(5)).draw(scores)
    assert torch.equal(first[0], again[0]) and torch.allclose(first[1].sum(-1), torch.ones(3, dtype=first[1].dtype))
    keyed_draft, draft_law = Sampler(SAMPLED, noise=noise).draw_draft(scores, [4, 5, 6])  # keyed, with its law
    assert torch.equal(keyed_draft, tokens) and draft_law is not None


def test_each_mode_verifies_as_its_function():
    scores, drafts = logits(4, seed=1), torch.tensor([3, 9, 1])
    assert Sampler().verify_chain(drafts, None, scores, 10) == verify_greedy(drafts, scores)
    noise = PositionNoise(2, VOCAB, "cpu")
    assert (Sampler(SAMPLED, noise=noise).verify_chain(drafts, None, scores, 10)
            == verify_keyed(drafts, scores, SAMPLED, noise, 10))
    from selfspec.sampling import WarpedRows

    draft_probs = torch.softmax(logits(3, seed=2), dim=-1).double()
    ours = Sampler(SAMPLED, generator=torch.Generator().manual_seed(9)).verify_chain(drafts, draft_probs, scores, 10)
    theirs = verify_sampled(drafts, draft_probs, WarpedRows(scores, SAMPLED), torch.Generator().manual_seed(9))
    assert ours == theirs


def test_nothing_in_the_package_branches_on_the_type_of_a_generator():
    package = Path(__file__).resolve().parents[2] / "selfspec"
    offending = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if re.search(r"isinstance\([^)]*PositionNoise", path.read_text())]
    assert not offending, f"isinstance(..., PositionNoise) in {offending}: ask the request's Sampler instead"
