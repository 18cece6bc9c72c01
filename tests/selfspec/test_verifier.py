"""The verifier on hand-made distributions: edge cases exactly, the output law statistically."""
import pytest
import torch
from scipy.stats import chisquare

from selfspec.sampling import SamplingConfig, logits_to_probs
from selfspec.verifier import verify_greedy, verify_sampled


def rows(*distributions):
    return torch.tensor(distributions, dtype=torch.float64)


def test_greedy_accepts_the_matching_prefix_and_returns_the_argmax_after_it():
    target_logits = rows([0, 5, 1], [3, 0, 1], [0, 0, 9], [1, 0, 0])  # argmax 1, 0, 2, 0
    assert verify_greedy(torch.tensor([1, 0, 2]), target_logits).__dict__ == dict(num_accepted=3, next_token=0)
    assert verify_greedy(torch.tensor([1, 2, 2]), target_logits).__dict__ == dict(num_accepted=1, next_token=0)
    assert verify_greedy(torch.tensor([0, 0, 2]), target_logits).__dict__ == dict(num_accepted=0, next_token=1)
    assert verify_greedy(torch.tensor([], dtype=torch.long), target_logits[:1]).__dict__ == dict(num_accepted=0, next_token=1)


def test_draft_equal_to_target_is_always_accepted():
    target = rows([0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.1, 0.1, 0.8])
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = torch.multinomial(target[:2], 1, generator=g)[:, 0]
        assert verify_sampled(tokens, target[:2].clone(), target, g).num_accepted == 2


def test_disjoint_supports_always_reject_and_recover_from_the_target():
    draft = rows([1.0, 0.0, 0.0, 0.0])
    target = rows([0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25])
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        verdict = verify_sampled(torch.tensor([0]), draft, target, g)
        assert verdict.num_accepted == 0 and verdict.next_token in (2, 3)
        seen.add(verdict.next_token)
    assert seen == {2, 3}


def test_point_mass_draft_on_a_zero_probability_token_is_rejected_and_never_recovered():
    target = rows([0.0, 0.7, 0.3], [1 / 3, 1 / 3, 1 / 3])
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        verdict = verify_sampled(torch.tensor([0]), None, target, g)
        assert verdict.num_accepted == 0 and verdict.next_token in (1, 2)


def test_point_mass_draft_on_a_certain_token_is_accepted_with_its_bonus():
    target = rows([0.0, 1.0, 0.0], [0.0, 0.0, 1.0])
    verdict = verify_sampled(torch.tensor([1]), None, target, torch.Generator().manual_seed(0))
    assert verdict.__dict__ == dict(num_accepted=1, next_token=2)


class _ScriptedUniform:
    """Stands in for `torch` inside the verifier: `rand` returns scripted uniforms, everything else is torch's."""

    def __init__(self, uniforms):
        self.uniforms = uniforms

    def __getattr__(self, name):
        return getattr(torch, name)

    def rand(self, n, generator=None, device=None, dtype=None):
        return torch.tensor(self.uniforms[:n], dtype=dtype, device=device)


def test_residual_guard_when_rounding_leaves_no_mass(monkeypatch):
    """Draft probs one ulp above the target's on the drafted token (rounding), none below: a uniform just under 1
    rejects it, and max(0, target - draft) is all zeros. The guard must recover from the target row, never 0/0.
    Catches (planted): the guard removed (NaN probabilities: multinomial raises or returns garbage)."""
    import selfspec.verifier

    target = rows([0.1, 0.2, 0.7], [0.5, 0.25, 0.25])
    draft = target[:1].clone()
    draft[0, 0] = torch.nextafter(draft[0, 0], torch.tensor(1.0, dtype=torch.float64))
    assert ((target[0] - draft[0]).clamp_min(0) == 0).all()  # exactly no residual mass
    largest_uniform = 1.0 - 2.0**-53  # the largest float64 below 1, which torch.rand can return
    monkeypatch.setattr(selfspec.verifier, "torch", _ScriptedUniform([largest_uniform]))
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        verdict = verify_sampled(torch.tensor([0]), draft, target, g)
        assert verdict.num_accepted == 0  # the rejection really happened
        seen.add(verdict.next_token)
    assert seen == {0, 1, 2}  # recovered from the target row (all of its support), not from a 0/0 residual


def test_truncated_supports_never_produce_a_token_outside_the_target_support():
    """top-k / top-p cut both sides identically; whatever the verdict, the token lies in the target's support."""
    g = torch.Generator().manual_seed(1)
    sampling = SamplingConfig(do_sample=True, top_k=3, top_p=0.8)
    for _ in range(100):
        target = logits_to_probs(torch.randn(3, 12, generator=g, dtype=torch.float64), sampling)
        draft = logits_to_probs(torch.randn(2, 12, generator=g, dtype=torch.float64), sampling)
        tokens = torch.multinomial(draft, 1, generator=g)[:, 0]
        verdict = verify_sampled(tokens, draft, target, g)
        assert target[verdict.num_accepted, verdict.next_token] > 0


def first_token_law(draft, target, num_samples, seed, verify=verify_sampled):
    """Empirical law of the first committed token: accepted draft token 0, or the recovered token."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(target.shape[1])
    for _ in range(num_samples):
        tokens = torch.multinomial(draft, 1, generator=g)[:, 0] if draft is not None else POINT_DRAFT
        verdict = verify(tokens, draft, target, g)
        counts[tokens[0] if verdict.num_accepted else verdict.next_token] += 1
    return counts


POINT_DRAFT = torch.tensor([2, 0])


def buggy_verify(draft_tokens, draft_probs, target_probs, generator=None):
    """The classic bug: on rejection, resample from the target instead of the residual."""
    verdict = verify_sampled(draft_tokens, draft_probs, target_probs, generator)
    if verdict.num_accepted < draft_tokens.shape[0]:
        from selfspec.verifier import Verdict

        token = int(torch.multinomial(target_probs[verdict.num_accepted], 1, generator=generator))
        return Verdict(verdict.num_accepted, token)
    return verdict


DRAFT = rows([0.5, 0.3, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25])
TARGET = rows([0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1])


@pytest.mark.parametrize("draft", [DRAFT, None], ids=["sampled-draft", "point-mass-draft"])
def test_first_token_follows_the_target_law(draft):
    counts = first_token_law(draft, TARGET, 6000, seed=0)
    assert chisquare(counts.numpy(), TARGET[0].numpy() * float(counts.sum())).pvalue > 1e-3


@pytest.mark.parametrize("draft", [DRAFT, None], ids=["sampled-draft", "point-mass-draft"])
def test_the_law_test_catches_resampling_from_the_target(draft):
    counts = first_token_law(draft, TARGET, 6000, seed=0, verify=buggy_verify)
    assert chisquare(counts.numpy(), TARGET[0].numpy() * float(counts.sum())).pvalue < 1e-6


def test_second_token_after_acceptance_follows_the_target_law():
    """Given draft 0 accepted, the next committed token (accepted draft 1, recovered or bonus) follows target row 1."""
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(4)
    for _ in range(10000):
        tokens = torch.multinomial(DRAFT, 1, generator=g)[:, 0]
        verdict = verify_sampled(tokens, DRAFT, TARGET, g)
        if verdict.num_accepted >= 1:
            counts[tokens[1] if verdict.num_accepted == 2 else verdict.next_token] += 1
    assert chisquare(counts.numpy(), TARGET[1].numpy() * float(counts.sum())).pvalue > 1e-3


def test_lazy_target_rows_give_the_same_verdicts_and_stop_warping_at_the_first_rejection():
    """The engine passes WarpedRows: same verdicts and generator use as a full tensor, and rows after the first
    rejection are never warped. Planted bug caught: a verifier that reads every row up front (num_warped == k + 1)."""
    from selfspec.sampling import WarpedRows

    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_p=0.9)
    g = torch.Generator().manual_seed(3)
    num_draft_tokens, vocab, seen = 4, 50, set()
    for trial in range(300):
        logits = torch.randn(num_draft_tokens + 1, vocab, generator=g, dtype=torch.float64) * 2
        draft_probs = logits_to_probs(logits[:num_draft_tokens] + torch.randn(num_draft_tokens, vocab, generator=g,
                                                                              dtype=torch.float64), sampling)
        tokens = torch.multinomial(draft_probs, 1, generator=g)[:, 0]
        full = verify_sampled(tokens, draft_probs, logits_to_probs(logits, sampling), torch.Generator().manual_seed(trial))
        rows = WarpedRows(logits, sampling)
        lazy = verify_sampled(tokens, draft_probs, rows, torch.Generator().manual_seed(trial))
        assert lazy == full
        assert rows.num_warped == full.num_accepted + 1
        seen.add(full.num_accepted)
    assert {0, num_draft_tokens} <= seen and len(seen) >= 3  # rejections early, late and none were exercised
