"""Draft-length policies: the adaptive one drafts little for a useless drafter, a lot for a perfect one, recovers,
weighs the device's verify cost, and never changes what greedy decoding returns."""
import math

import pytest
import torch

from selfspec import Draft, SelfSpecModel
from selfspec.draft_length.policy import AdaptiveDraftLength, FixedDraftLength, VerifyCost, draft_length_policy, measure_verify_cost
from selfspec.draft_length.verify_cost import prior_verify_cost
from selfspec.target import TargetModel
from selfspec.drafters import MedusaDrafter
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.scripted_time import ScriptedClock, scripted_engine_clock
from tests.selfspec.exercised import (
    RecordingDrafter, assert_exercised, head_confidences, scrambled_model, sharpened, trained_heads,
)

CPU_LIKE = VerifyCost(tuple(1 + 0.15 * k for k in range(9)))  # FACTS.md: verifying 5 ~ 1.6-1.9 decode steps
GPU_LIKE = VerifyCost((1.0,) * 9)
STEEP = VerifyCost(tuple(1 + 1.0 * k for k in range(9)))  # verifying costs as much as decoding each token


def run_steps(policy, acceptance, steps):
    """Feed the policy `steps` steps where each draft is accepted iff acceptance(position) says so; return the ks."""
    chosen = []
    for _ in range(steps):
        k = policy.choose()
        accepted = 0
        while accepted < k and acceptance(accepted):
            accepted += 1
        policy.observe(k, accepted)
        chosen.append(k)
    return chosen


def test_verify_cost_extrapolates_linearly():
    cost = VerifyCost((1.0, 1.2, 1.5))
    assert (cost(0), cost(2), cost(4)) == (1.0, 1.5, pytest.approx(2.1))


class _ScriptedTarget:
    """A TargetModel whose forwards take scripted seconds on a scripted clock: base[k] for k + 1 tokens, plus
    `extra[(round, k)]` (a disturbance) in the given round of measure_verify_cost's interleaved rounds."""

    def __init__(self, target, clock, base, extra):
        self.target, self.clock, self.base, self.extra = target, clock, base, extra
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward(self, token_ids, cache):
        if self.calls:  # the first forward is the context's prefill, not timed
            k = token_ids.shape[0] - 1
            round_ = (self.calls - 1) // len(self.base)
            self.clock.advance(self.base[k] + self.extra.get((round_, k), 0.0))
        self.calls += 1
        return self.target.forward(token_ids, cache)


def test_measured_cost_curve_keeps_the_fastest_round_and_pools_violations(monkeypatch):
    """measure_verify_cost on scripted times (its clock is `time.perf_counter` inside verify_cost.py, replaced here):
    a warm-up pass 50x slower is ignored, a slow outlier in one pass is beaten by the other passes' minimum, and a
    dip (verifying 5 drafts faster than 4) is pooled with its neighbour, not raised to a running maximum.
    Catches (planted): the slowest round kept instead of the fastest; a running maximum instead of pooling."""
    import types

    import selfspec.draft_length.verify_cost

    clock = ScriptedClock()
    monkeypatch.setattr(selfspec.draft_length.verify_cost, "time", types.SimpleNamespace(perf_counter=clock))
    base = [0.010, 0.012, 0.014, 0.016, 0.019, 0.017, 0.022, 0.024, 0.026]  # seconds for k = 0 .. 8
    extra = {(0, k): 0.5 for k in range(9)} | {(2, 3): 0.050}  # warm-up pass; one slow forward in pass 2
    target = _ScriptedTarget(TargetModel(tiny_model("llama")), clock, base, extra)
    cost = measure_verify_cost(target, max_draft_tokens=8, context_length=16, repeats=3)
    assert cost.decode_seconds == pytest.approx(0.010)
    assert cost.relative == pytest.approx((1.0, 1.2, 1.4, 1.6, 1.8, 1.8, 2.2, 2.4, 2.6))


def test_useless_drafts_shrink_k_to_zero_but_probes_continue():
    policy = AdaptiveDraftLength(CPU_LIKE, probe_every=8)
    chosen = run_steps(policy, lambda position: False, 100)
    assert chosen[0] > 0  # the prior is optimistic enough to try
    assert chosen[-70:].count(0) >= 60 and max(chosen[-70:]) == 1  # mostly off; only single-token probes


def test_useless_drafts_stop_where_verifying_them_is_free():
    # Where verifying a draft costs no more than decoding (a GPU; SmolLM2 on one CPU thread at k = 1), any acceptance
    # estimate above 0 would make drafting look worth it while the estimate decays towards 0: the policy wants a gain.
    chosen = run_steps(AdaptiveDraftLength(GPU_LIKE, probe_every=8), lambda position: False, 100)
    assert chosen[0] > 0 and chosen[30:].count(0) >= 65
    assert run_steps(AdaptiveDraftLength(GPU_LIKE, probe_every=8), lambda position: True, 30)[-10:] == [8] * 10


def test_perfect_drafts_grow_k_to_the_maximum():
    policy = AdaptiveDraftLength(CPU_LIKE, max_draft_tokens=8)
    assert run_steps(policy, lambda position: True, 30)[-10:] == [8] * 10


def test_a_drafter_that_turns_good_is_noticed():
    policy = AdaptiveDraftLength(CPU_LIKE, probe_every=8)
    run_steps(policy, lambda position: False, 40)
    assert run_steps(policy, lambda position: True, 40)[-5:] == [8] * 5


def test_rejected_probes_back_off_and_drafting_again_resets_them():
    """A useless drafter is probed after 2, 5, 11, 15, 15 ... steps at k=0 (each rejected probe doubles the wait plus
    a step, up to 15 for a drafter whose probes are cheap), not every 2 steps; once probes are accepted drafting
    resumes within a few steps, and the waits start short again. Catches (planted): the wait not doubled (97 probes
    in 200 steps), the wait never reset, even waits (2, 4, 8, 16)."""
    policy = AdaptiveDraftLength(CPU_LIKE)
    chosen = run_steps(policy, lambda position: False, 200)
    first_off = chosen.index(0)
    probes = [i - first_off for i, k in enumerate(chosen) if i > first_off and k]
    gaps = [b - a for a, b in zip([-1] + probes, probes)]
    assert gaps == [2, 5, 11] + [15] * (len(gaps) - 3)
    assert set(chosen[first_off:]) == {0, 1}
    good = run_steps(policy, lambda position: True, 150)
    assert good[-5:] == [8] * 5
    recovered = next(i for i, k in enumerate(good) if k > 1)
    assert recovered <= 16  # at most the longest wait, then the policy's own choice
    # After recovery the waits start short again: a drafter that turns useless is probed after 2 steps first.
    again = run_steps(policy, lambda position: False, 100)
    first_off = again.index(0)
    assert again[first_off : first_off + 2] == [0, 1]


def test_a_costly_drafters_probes_stay_within_the_probe_budget():
    """Probes spend at most 1 % of decoding (credit for 2 at first): a probe of a cheap drafter (n-gram, heads: up to
    a tenth of a decode) comes every 15 steps once rejected, one of early exit at the reference model's layer 2 (0.54
    decodes a draft token) every 54 steps, one costing a whole decode every 100. Catches (planted): no budget (a
    probe every 15 steps whatever it costs)."""
    for draft_cost, gap in [(0.0, 15), (0.1, 15), (0.54, 54), (1.0, 100)]:
        policy = AdaptiveDraftLength(CPU_LIKE, draft_cost=draft_cost)
        chosen = run_steps(policy, lambda position: False, 500)
        first_off = chosen.index(0)
        probes = [i for i, k in enumerate(chosen) if i > first_off and k]
        assert [b - a for a, b in zip(probes, probes[1:])][-3:] == [gap] * 3
        assert len(probes) <= 2 + 500 * 0.01 / draft_cost if draft_cost else len(probes) <= 3 + 500 / 15


def run_positions(policy, right, num_tokens):
    """Decode `num_tokens` positions as the engine steps through them: at position p a draft's first right(p) tokens
    are right (None: the drafter declines, proposing nothing); a probe is scored in shadow and moves one position on,
    a verified draft its accepted tokens + 1. Returns [(position, k asked, probe, accepted)] per step."""
    position, steps = 0, []
    while position < num_tokens:
        k = policy.choose()
        good = right(position)
        drafted = 0 if good is None else k
        accepted = 0 if good is None else min(drafted, good)
        probe = k > 0 and policy.probe_in_shadow()
        policy.observe(drafted, accepted)
        steps.append((position, k, probe, accepted))
        position += 1 if probe else accepted + 1
    return steps


CPU_PRIOR = prior_verify_cost(torch.device("cpu"))  # the curve "auto" plans with before it has timed anything


@pytest.mark.parametrize("bad_start", [40, 130])
def test_drafting_comes_back_soon_after_an_unlucky_start(bad_start):
    """Drafts (a tenth of a decode each, as Medusa heads) rejected at the first `bad_start` positions, then always
    right: "auto" drafts for real again within 17 steps of the turn (the longest wait, 15, then a step or two on the
    evidence) and then runs near the maximum (the reference model's Medusa heads, rejected on their first steps on a
    snippet of `accelerate`, once drafted 2 tokens in 128 steps and none after). Checked against the planted old
    behaviour (a probe after 8 steps, rejected probes doubling the wait to 64, accepted ones keeping it, plain steps
    not ageing the evidence): it drafted again 48 steps after a 40-position start, and not at all in 128 positions
    after 130."""
    policy = AdaptiveDraftLength(CPU_PRIOR, draft_cost=0.1)
    steps = run_positions(policy, lambda position: 0 if position < bad_start else 8, bad_start + 128)
    turn = next(i for i, (position, *_) in enumerate(steps) if position >= bad_start)
    back = next((i for i, (_, k, probe, _) in enumerate(steps) if i >= turn and k and not probe), None)
    assert back is not None and back - turn <= 17
    assert sum(1 for _, k, probe, _ in steps[:turn] if k and not probe) <= 3  # the bad start: off, but for probes
    assert 128 / (len(steps) - turn) > 4  # tokens per step after the turn (8 drafts + 1 at most)


def test_a_drafter_right_every_other_position_is_found_by_probes_at_odd_waits():
    """The reference model repeating `_set_set_set...`: its Medusa heads right after `set` (every draft accepted),
    unsure after `_` (nothing proposed). A fixed k drafts in step with it; probes at even waits land after `_` every
    time. Probes at odd waits alternate between the two, so "auto" finds the positions that pay and keeps drafting
    from there (about 3 tokens a step). Checked against the planted old behaviour (waits 8, 16, 32, 64): every probe
    declined, no draft in 256 positions (1.00 token a step); with even waits and the rest of this policy, the same."""
    policy = AdaptiveDraftLength(CPU_PRIOR, draft_cost=0.1)
    steps = run_positions(policy, lambda position: 0 if position < 20 else (8 if position % 2 == 0 else None), 256)
    assert sum(1 for _, k, probe, accepted in steps if k and not probe and accepted) > 10
    assert 256 / len(steps) > 2.5


def run_declining_steps(policy, proposes, steps):
    """Feed `steps` steps where the drafter, asked for k > 0, proposes k drafts (all accepted) when proposes(step),
    else nothing (a decline); each step takes its verify forward plus 0.1 decodes per draft token asked (the drafter
    runs either way). Returns the ks asked."""
    chosen = []
    for step in range(steps):
        k = policy.choose()
        drafted = k if proposes(step) else 0
        policy.observe(drafted, drafted, seconds=0.01 * (CPU_LIKE(drafted) + 0.1 * k))
        chosen.append(k)
    return chosen


def test_a_drafter_that_always_declines_is_soon_not_asked():
    """Heads below their confidence floor propose nothing when asked, while each ask costs their forward: the policy
    learns the decline rate, stops asking, and its probes back off as rejected ones do (to one per 15 steps: at 0.1
    decodes an ask, under 1 % of decoding). Catches (planted): declines not learned (asked on every step at the
    prior's acceptance), declined probes not backing off (an ask every 10 steps, as far as the budget goes: 23)."""
    policy = AdaptiveDraftLength(VerifyCost(CPU_LIKE.relative, decode_seconds=0.01), draft_cost=0.1)
    chosen = run_declining_steps(policy, lambda step: False, 200)
    assert policy.decline_rate() > 0.5
    asks = [step for step, k in enumerate(chosen) if k]
    assert len(asks) <= 2 + 3 + 200 // 15  # 2 asks at the start, then probes after 2, 5, 11, 15, 15 ... steps
    assert [b - a for a, b in zip(asks, asks[1:])][-5:] == [15] * 5


def test_a_drafter_that_declines_half_the_time_but_is_right_is_still_asked():
    """n-gram-like: no match on every other step, every proposed draft accepted: asking still pays, so the policy
    keeps asking at k > 1 (a guard for the decline rate's pricing; planted: declines not learned fails the rate)."""
    policy = AdaptiveDraftLength(VerifyCost(CPU_LIKE.relative, decode_seconds=0.01))
    chosen = run_declining_steps(policy, lambda step: step % 2 == 0, 100)
    assert 0.3 < policy.decline_rate() < 0.7 and chosen[-20:].count(0) == 0 and max(chosen[-20:]) > 1


def test_a_costly_drafter_is_not_tried_at_length_before_its_first_timing():
    """The drafter's draft_cost is where the learned per-token cost starts: a draft token said to cost a whole
    decode makes the untried drafter (prior acceptance 0.5) start at k=0; timings that show it costs nothing teach
    the policy otherwise. Catches (planted): draft_cost ignored (k=8 ... from the first step)."""
    assert AdaptiveDraftLength(CPU_LIKE).choose() > 0
    costly = AdaptiveDraftLength(VerifyCost(CPU_LIKE.relative, decode_seconds=0.01), draft_cost=1.0)
    assert costly.overhead.per_token == 1.0 and costly.choose() == 0
    for k in [1, 2, 3, 1, 2, 3] * 5:  # the steps took only their verify forward: drafting is free
        costly.observe(k, k, seconds=0.01 * CPU_LIKE(k))
    assert costly.overhead.per_token < 0.1 and costly.choose() > 0
    with pytest.raises(ValueError, match="draft_cost"):
        AdaptiveDraftLength(CPU_LIKE, draft_cost=-1.0)


def test_the_last_token_is_not_read_as_a_decline():
    """A step with one token left drafts nothing; the policy is not asked then, so it does not learn a decline from a
    drafter that was never asked. Catches (planted): the capped ask still made (declined > 0)."""
    model = tiny_model("llama", seed=4)
    prompt = random_prompt(6, seed=5)
    continuation = model.generate(prompt, max_new_tokens=11, do_sample=False, eos_token_id=None, pad_token_id=2,
                                  attention_mask=torch.ones_like(prompt))[0]
    policy = _Recording(VerifyCost(GPU_LIKE.relative, decode_seconds=1.0), learn_step_cost=False)
    spec = SelfSpecModel(model, drafter=_Scripted(continuation, 96, wrong=False))
    out = spec.generate(prompt, max_new_tokens=11, num_draft_tokens=policy, eos_token_id=[])
    assert torch.equal(out.sequences[0], continuation)
    assert policy.chosen == [8] and out.stats.accepted == 8  # one step of 8 drafts, then the last token alone
    assert policy.declined == 0.0


def test_a_drafting_steps_fixed_cost_is_not_charged_to_plain_decoding():
    """An always-rejected drafter whose every ask costs 0.25 decodes beyond its verify forward, whatever k (the drafter
    and the verifier run once per drafting step), and plain steps that cost 0.05 beyond theirs: the policy learns the
    two kinds of steps apart, so after its first asks k = 1 is priced at what it cost, and the drafter is asked at
    most 4 times in the first 32 steps (probes scored in shadow aside; 3 here; later, once plain steps have aged the
    cost learned, it is asked again now and then: once more here, at step 74). Fitted as one line through every
    step, the ask's fixed cost was read as per step, charged to k = 0 too, and k = 1 kept looking
    cheap: 9 asks in the first 32 steps (random Medusa heads, greedy, on SmolLM2: 6-9 asks a call). Catches
    (planted): that one line."""
    curve = VerifyCost(tuple(1 + 0.1 * k for k in range(9)), decode_seconds=0.01)
    policy = AdaptiveDraftLength(curve)
    asks = []
    for step in range(128):
        k = policy.choose()
        if k and policy.probe_in_shadow():  # as the engine scores a probe: no timing taught
            policy.observe(1, 0, seconds=None)
        elif k:
            asks.append(step)
            policy.observe(k, 0, seconds=0.01 * (curve(k) + 0.25))
        else:
            policy.observe(0, 0, seconds=0.01 * (curve(0) + 0.05))  # a plain step's own bookkeeping
    assert 1 <= len([step for step in asks if step < 32]) <= 4 and len(asks) <= 7
    assert policy.step_overhead(0) == pytest.approx(0.05, abs=1e-6)  # learned from plain steps only


def test_one_stalled_step_does_not_stop_drafting():
    """Always-right drafts on a GPU-like device; one step takes 50 decodes (a GPU's first forward of a new shape, an
    OS stall). The policy learns from it as at most OUTLIER_RATIO x its prediction and keeps drafting long; a cost
    that stays high is still learned within a few steps. Catches (planted): no clipping (k = 0 after the stall)."""
    policy = AdaptiveDraftLength(VerifyCost(GPU_LIKE.relative, decode_seconds=0.01))
    for k in [2, 5, 8] * 7:  # steps of several lengths, each taking just its verify forward
        policy.choose()
        policy.observe(k, k, seconds=0.01 * GPU_LIKE(k))
    assert policy.choose() == 8
    policy.observe(8, 8, seconds=0.01 * 50)  # the stall
    assert policy.overhead.per_token < 0.2
    chosen = []
    for _ in range(10):
        chosen.append(policy.choose())
        policy.observe(chosen[-1], chosen[-1], seconds=0.01 * GPU_LIKE(chosen[-1]))
    assert chosen == [8] * 10
    dear = AdaptiveDraftLength(VerifyCost(GPU_LIKE.relative, decode_seconds=0.01))
    for _ in range(10):  # every step really costs 16 decodes beyond its verify forward
        dear.observe(8, 8, seconds=0.01 * (GPU_LIKE(8) + 16.0))
    assert dear.overhead.predict(8) > 14


def test_costly_verification_asks_for_fewer_drafts():
    """Acceptance 0.7 per position: a flat (GPU-like) cost drafts a lot, a steep one drafts less."""
    acceptance = [0.7] * 8

    def k_for(cost):
        policy = AdaptiveDraftLength(cost, prior_acceptance=0.7, learn_step_cost=False)
        policy.tried, policy.accepted = [1000.0] * 8, [700.0] * 8
        return policy.choose()

    assert k_for(GPU_LIKE) == 8 and k_for(CPU_LIKE) < 8 and k_for(STEEP) == 0
    assert AdaptiveDraftLength(CPU_LIKE).expected_tokens(0) == 1.0


def test_expected_tokens_follow_the_acceptance_estimates_and_the_decline_rate():
    """E(k) = 1 + (1 - declined) * sum_{i<k} prod_{j<=i} a_j, the one-pass list included; k past the policy's
    positions adds nothing."""
    policy = AdaptiveDraftLength(CPU_LIKE, max_draft_tokens=4, learn_step_cost=False)
    policy.tried, policy.accepted = [10.0, 8.0, 4.0, 2.0], [8.0, 4.0, 2.0, 0.0]
    policy.asked, policy.declined = 9.0, 3.0
    rates, kept = policy.acceptance(), 1.0 - 3.0 / 10.0
    by_hand = [1.0] + [1.0 + kept * sum(math.prod(rates[: i + 1]) for i in range(k)) for k in (1, 2, 3, 4)]
    assert policy.expected_tokens_up_to(6) == pytest.approx(by_hand + by_hand[-1:] * 2, rel=1e-12)
    assert [policy.expected_tokens(k) for k in range(7)] == policy.expected_tokens_up_to(6)


def test_a_tree_is_priced_by_the_nodes_it_verifies():
    """A tree k levels deep verifies up to its node budget (here min(6, 4k)) and is priced so: where each verified
    token costs half a decode, acceptance 0.7 still buys a chain but no tree; on a flat (GPU-like) curve nodes are
    free and the tree goes deep. Catches (planted): verified_tokens ignored in step_cost."""
    def policy_for(cost, verified_tokens=None):
        policy = AdaptiveDraftLength(cost, prior_acceptance=0.7, learn_step_cost=False, verified_tokens=verified_tokens)
        policy.tried, policy.accepted = [1000.0] * 8, [700.0] * 8
        return policy

    tree = lambda k: min(6, 4 * k)  # noqa: E731
    assert policy_for(CPU_LIKE, tree).step_cost(1) == pytest.approx(CPU_LIKE(4))
    assert policy_for(CPU_LIKE).step_cost(1) == CPU_LIKE(1)
    half = VerifyCost(tuple(1 + 0.5 * k for k in range(9)))
    assert policy_for(half).choose() > 0 and policy_for(half, tree).choose() == 0
    assert policy_for(GPU_LIKE, tree).choose() == 8


def test_acceptance_is_estimated_per_position():
    """Position 0 always accepted, position 1 never: k settles at 1 (trying 2 now and then, as position 1's
    evidence is shrunk towards position 0's)."""
    policy = AdaptiveDraftLength(CPU_LIKE)
    assert run_steps(policy, lambda position: position == 0, 60)[-20:].count(1) >= 16
    rates = policy.acceptance()
    assert rates[0] > 0.8 and rates[1] < 0.3  # 0.86 is the most 10 observations + a prior worth 4 allow


def test_a_position_that_looked_bad_early_is_tried_again():
    """A tree's second level rejected on the first 12 steps, then always accepted: the policy settles on one level,
    where the second level is never drafted, so no evidence could change its estimate; its evidence ages with every
    step that does not reach it, so deep trees come back within a few steps. Where the second level stays useless it is
    retried at growing intervals (each rejection is evidence that ages again). Catches (planted): no ageing
    (stale_decay=1: one level for the remaining 188 steps)."""
    tree = lambda k: min(6, 4 * k)  # noqa: E731

    def steps(stale_decay, right_after, num_steps=200):
        policy = AdaptiveDraftLength(CPU_LIKE, stale_decay=stale_decay, verified_tokens=tree, learn_step_cost=False)
        chosen = []
        for step in range(num_steps):
            k, accepted = policy.choose(), 0
            while accepted < k and (accepted == 0 or step >= right_after):
                accepted += 1
            policy.observe(k, accepted)
            chosen.append(k)
        return chosen

    assert steps(1.0, 12)[12:].count(1) >= 185  # stuck one level deep
    recovered = steps(0.95, 12)
    assert recovered[12:].count(1) <= 5 and recovered[-50:] == [8] * 50
    never = steps(0.95, 10**9)  # the second level never right: tried again now and then, not often
    assert never[20:].count(1) >= 150 and 3 <= sum(k > 1 for k in never[20:]) <= 30


def test_policy_from_argument():
    assert isinstance(draft_length_policy(3), FixedDraftLength)
    assert isinstance(draft_length_policy("auto", lambda: CPU_LIKE), AdaptiveDraftLength)
    policy = AdaptiveDraftLength(GPU_LIKE)
    assert draft_length_policy(policy) is policy
    with pytest.raises(ValueError, match='"auto"'):
        draft_length_policy("fast")


@pytest.mark.parametrize("drafter,options", [("ngram", {}), ("early_exit", {"exit_layer": 1}), ("none", {})])
def test_auto_keeps_greedy_identity(drafter, options):
    """On a scripted clock (CPU-like verify costs; wall-clock timings made which drafts "auto" asked for, and so
    whether any was rejected, vary run to run)."""
    model = tiny_model("llama", seed=2)
    prompt = repetitive_prompt(20, seed=3)
    expected = model.generate(
        prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=2, attention_mask=torch.ones_like(prompt)
    )
    spec = SelfSpecModel(model, drafter=drafter, **options)
    if drafter == "early_exit":  # priced as free, so "auto" drafts for real (its probes are scored in shadow)
        spec.drafter.draft_cost = 0.0
    scripted_engine_clock(spec, lambda num_tokens: CPU_LIKE(num_tokens - 1))
    out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens="auto", eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    if drafter == "none":
        assert out.stats.drafted == 0
    else:
        assert_exercised(out.stats, what=drafter)
    assert spec.verify_cost() is spec.verify_cost()  # measured once per model, then kept


class _Scripted:
    """Proposes the model's own greedy continuation (oracle) or that continuation shifted by one id (always wrong)."""

    def __init__(self, continuation, vocab_size, wrong):
        self.continuation, self.vocab_size, self.wrong = continuation, vocab_size, wrong

    def propose(self, context):
        n = context.token_ids.shape[0]
        tokens = self.continuation[n : n + context.num_draft_tokens]
        return Draft((tokens + 1) % self.vocab_size if self.wrong else tokens)

    def observe(self, num_drafted, num_accepted):
        pass


class _Recording(AdaptiveDraftLength):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chosen = []

    def choose(self):
        self.chosen.append(super().choose())
        return self.chosen[-1]


def test_auto_drafts_little_for_a_useless_drafter_and_much_for_an_oracle():
    """On a scripted clock: verifying k drafts costs CPU_LIKE(k) seconds and nothing else does (the engine's `clock`
    hook), and the policy plans with that same curve, so its choices are exact functions of acceptance. After a
    short warm-up it drafts almost nothing for an always-wrong drafter and nearly the maximum for an oracle.
    Catches (planted): the policy's acceptance update ignoring rejections (k stays up for the useless drafter)."""
    model = tiny_model("llama", seed=4)
    prompt = random_prompt(6, seed=5)
    continuation = model.generate(
        prompt, max_new_tokens=100, do_sample=False, eos_token_id=None, pad_token_id=2, attention_mask=torch.ones_like(prompt)
    )[0]
    later_k = {}
    for wrong in (True, False):
        spec = SelfSpecModel(model, drafter=_Scripted(continuation, 96, wrong))
        scripted_engine_clock(spec, lambda num_tokens: CPU_LIKE(num_tokens - 1))
        policy = _Recording(VerifyCost(CPU_LIKE.relative, decode_seconds=1.0))
        out = spec.generate(prompt, max_new_tokens=100, num_draft_tokens=policy, eos_token_id=[])
        assert torch.equal(out.sequences[0], continuation)
        assert policy.overhead.per_step == pytest.approx(0.0, abs=1e-9)  # steps took exactly their verify cost
        later = policy.chosen[len(policy.chosen) // 2 :]
        later_k[wrong] = sum(later) / len(later)
    assert later_k[True] < 0.5 and later_k[False] > 6


class _WrongEvery:
    """Proposes the model's greedy continuation with every `period`-th position of the sequence wrong: acceptance
    that varies step by step, so "auto" asks for drafts of several sizes."""

    def __init__(self, continuation, vocab_size, period):
        self.continuation, self.vocab_size, self.period = continuation, vocab_size, period

    def propose(self, context):
        n = context.token_ids.shape[0]
        tokens = self.continuation[n : n + context.num_draft_tokens].clone()
        for j in range(tokens.shape[0]):
            if (n + j) % self.period == 0:
                tokens[j] = (tokens[j] + 1) % self.vocab_size
        return Draft(tokens)

    def observe(self, num_drafted, num_accepted):
        pass


def test_the_first_forward_of_each_draft_size_is_not_a_measurement(monkeypatch, tmp_path):
    """A GPU's first forward of each new shape loads kernels (reference model, bfloat16, H200: 70-1200 ms against 8
    after). Scripted: the first forward over each token count costs 100 decodes, every later one 1 (a flat, GPU-like
    cost). "auto" still learns a cheap curve and drafts long, the output unchanged.
    Catches (planted): first forwards timed (the curve learns 32 decodes at k = 8, 2.1 tokens per forward)."""
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    model = tiny_model("llama", seed=4)
    prompt = random_prompt(6, seed=5)
    continuation = model.generate(prompt, max_new_tokens=100, do_sample=False, eos_token_id=None, pad_token_id=2,
                                  attention_mask=torch.ones_like(prompt))[0]
    spec = SelfSpecModel(model, drafter=_WrongEvery(continuation, 96, period=5))
    seen = set()

    def seconds(num_tokens):
        first = num_tokens not in seen
        seen.add(num_tokens)
        return 100.0 if first else 1.0

    scripted_engine_clock(spec, seconds)
    out = spec.generate(prompt, max_new_tokens=100, num_draft_tokens="auto", eos_token_id=[])
    assert torch.equal(out.sequences[0], continuation)
    assert len(seen) > 4  # several draft sizes ran
    assert_exercised(out.stats, what="wrong every 5th position")
    assert spec.verify_cost()(8) < 2.5
    assert out.stats.tokens_per_forward > 3.5


def test_medusa_confidence_threshold_drafts_fewer_and_stays_exact():
    """Thresholds 0, the median confidence of heads 2..4 along the output, and 1: fewer and fewer drafts, the output
    unchanged; at the median, chains stop after some heads (not only before the first) and drafts are accepted.
    Catches (planted): the threshold ignored; heads kept up to and including the first unsure one."""
    model = sharpened(scrambled_model("qwen2", seed=6), 4.0)  # same argmax; heads through its LM head get confident
    prompt = random_prompt(9, seed=7)
    expected = model.generate(
        prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=2, attention_mask=torch.ones_like(prompt)
    )
    heads = trained_heads(model, [expected[0, :24]])  # right early, wrong later
    median = float(head_confidences(heads, model, expected[0])[:, 1:].median())
    drafted = {}
    for threshold in (0.0, median, 1.0):
        drafter = RecordingDrafter(MedusaDrafter(heads, min_draft_confidence=threshold), keep_contexts=True)
        out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=30, num_draft_tokens=4, eos_token_id=[])
        assert torch.equal(out.sequences, expected)
        drafted[threshold] = out.stats.drafted
        if threshold == median:
            assert_exercised(out.stats)
            assert drafter.stopped_mid_chain() > 0, drafter.steps
            for (asked, proposed), context in zip(drafter.steps, drafter.contexts):  # the heads before the first unsure
                with torch.no_grad():
                    sure = heads(context.hidden_state, model.lm_head).softmax(dim=-1).amax(dim=-1) >= threshold
                assert proposed == min(asked, int(sure.long().cumprod(0).sum()))
    assert drafted[0.0] > drafted[median] > drafted[1.0] == 0


def test_a_tree_is_priced_by_the_nodes_such_trees_verified():
    """Trees of a 32-node budget (4 children per level: min(32, 4k) k levels deep) under a node floor verify 5 nodes
    from depth 2 on. Priced at their budget, where each verified token costs 0.1 decodes, they stay two levels deep;
    told what each step verified, the policy prices a depth at what steps drafting it verified (a depth not drafted
    yet: as the depths below it grew) and goes deep within a few steps. A chain is priced as before. Catches
    (planted): `verified` ignored (two levels for good)."""
    budget = lambda k: min(32, 4 * k)  # noqa: E731
    floored = lambda k: min(budget(k), 5)  # noqa: E731
    tenth = VerifyCost(tuple(1 + 0.1 * k for k in range(33)))

    def depths(learns, num_steps=30):
        policy = AdaptiveDraftLength(tenth, prior_acceptance=0.7, learn_step_cost=False, verified_tokens=budget)
        chosen = []
        for _ in range(num_steps):
            policy.tried, policy.accepted = [1000.0] * 8, [700.0] * 8  # acceptance 0.7 at every depth, kept so
            k = policy.choose()
            policy.observe(k, min(k, 1), **({"verified": floored(k)} if learns else {}))
            chosen.append(k)
        return chosen, policy

    stuck, policy = depths(learns=False)
    assert stuck == [2] * 30 and policy.tokens_verified(3) == 12
    deep, policy = depths(learns=True)
    assert deep[:1] == [2] and deep[-20:] == [8] * 20
    assert policy.tokens_verified(1) == 4 and policy.tokens_verified(8) == pytest.approx(5, abs=0.2)
    assert policy.step_cost(8) == pytest.approx(tenth(5), abs=0.02)
    chain = AdaptiveDraftLength(CPU_LIKE)
    assert [chain.tokens_verified(k) for k in range(9)] == list(range(9)) and chain.step_cost(3) == CPU_LIKE(3)
