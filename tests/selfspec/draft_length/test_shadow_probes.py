"""Probes scored in shadow (selfspec/verify_step.py `verify_in_shadow`, engine.py `scores_in_shadow`): when "auto"
drafts one token only to keep observing acceptance, the step is plain decoding's (same forward, same tokens, same
draws from the user's generator) and the probe's token is scored against the distribution that forward computed, with
the verifier's own rule (greedy: the argmax; sampled: u < p / q). Checked here: outputs identical to speculation off,
outcomes equal to the rule replayed step by step (with a planted wrong rule caught), and "auto" drafting again after
probes a good drafter passes in shadow."""
import dataclasses
import json
import random

import pytest
import torch

import selfspec.draft_length.verify_cost as verify_cost
from selfspec import SelfSpecModel
from selfspec.draft_length.batch import BatchDraftLength
from selfspec.draft_length.policy import AdaptiveDraftLength
from selfspec.drafters.base import Draft
from selfspec.sampling import SamplingConfig, logits_to_probs
from selfspec.verifier import probe_accepted
from selfspec.draft_length.verify_cost import LearnedVerifyCost, VerifyCost, prior_verify_cost
from tests.conftest import VOCAB, random_prompt, tiny_model


class AlwaysProbe:
    """A draft-length policy that asks for one token every step and says it is a probe; records what it observes."""

    def __init__(self):
        self.observed = []

    def probe_in_shadow(self, full_forward=True) -> bool:
        return True

    def choose(self) -> int:
        return 1

    def observe(self, num_drafted, num_accepted, seconds=None):
        self.observed.append((num_drafted, num_accepted, seconds))


class ScriptedDrafter:
    """Proposes the given continuation's next tokens (right), except on every `wrong_every`-th ask, where the first
    token is shifted by one (wrong). With `draft_prob`, drafts carry probs putting that mass on the proposed token and
    the rest spread evenly (the sampled rule then reads q = draft_prob); without, point masses."""

    def __init__(self, sequence: torch.Tensor, wrong_every: int = 2, draft_prob: float | None = None):
        self.sequence, self.wrong_every, self.draft_prob = sequence[0], wrong_every, draft_prob
        self.asks, self.proposed = 0, []  # (position of the first draft token, tokens)

    def propose(self, context):
        start = context.token_ids.shape[0]  # the first draft follows the pending token
        tokens = self.sequence[start : start + context.num_draft_tokens].clone()
        if self.wrong_every and self.asks % self.wrong_every == 1 and tokens.numel():
            tokens[0] = (tokens[0] + 1) % VOCAB
        self.asks += 1
        self.proposed.append((start, tokens))
        probs = None
        if self.draft_prob is not None:
            probs = torch.full((tokens.numel(), VOCAB), (1.0 - self.draft_prob) / (VOCAB - 1), dtype=torch.float64)
            probs[torch.arange(tokens.numel()), tokens] = self.draft_prob
        return Draft(tokens, probs)

    def observe(self, num_drafted, num_accepted):
        pass


def greedy_reference(model, prompt, n):
    return model.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=2,
                          attention_mask=torch.ones_like(prompt))


def test_greedy_probes_in_shadow_are_plain_decoding_and_scored_by_the_argmax():
    model, prompt = tiny_model("llama", seed=3), random_prompt(10, seed=4)
    expected = greedy_reference(model, prompt, 30)
    drafter, policy = ScriptedDrafter(expected), AlwaysProbe()
    out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=30, num_draft_tokens=policy,
                                                          eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    stats = out.stats
    assert stats.drafted == 0 and stats.target_forwards == stats.new_tokens == 30  # nothing verified: plain decoding
    asks = len(drafter.proposed)
    assert asks == 28 and stats.probed == asks  # 29 steps; the last has no budget for a draft, so is not asked
    # right on even asks only; a probe's step time (a plain decode's) is not given; the last step drafted nothing
    assert policy.observed[:asks] == [(1, int(i % 2 == 0), None) for i in range(asks)]
    assert [drafted for drafted, _, _ in policy.observed[asks:]] == [0]
    assert stats.probes_accepted == (asks + 1) // 2


def _replayed_outcomes(model, sequences, proposed, sampling: SamplingConfig, draft_prob: float, rule=probe_accepted):
    """What each probe's outcome must be: the rule, with the engine's private uniforms (random.Random(0), one per
    probe in order), q = draft_prob and p the target's warped distribution at the probe's position."""
    logits = model(sequences).logits[0]  # [T, vocab]; row t scores token t + 1
    uniforms = random.Random(0)
    outcomes = []
    for start, tokens in proposed:
        target_row = logits_to_probs(logits[start - 1], sampling)
        outcomes.append(int(rule(int(tokens[0]), draft_prob, target_row, uniforms.random())))
    return outcomes


@pytest.mark.parametrize("draft_prob", [1.0, 0.02])
def test_sampled_probes_leave_the_tokens_and_generator_alone_and_follow_the_verifier_rule(draft_prob):
    model, prompt = tiny_model("llama", seed=5), random_prompt(10, seed=6)
    sampling = dict(do_sample=True, temperature=1.3, top_k=20)
    torch.manual_seed(11)  # unseeded calls: rejection sampling on torch's global generator
    plain = SelfSpecModel(model, drafter="none").generate(prompt, max_new_tokens=40, eos_token_id=[], **sampling)
    drafter, policy = ScriptedDrafter(plain.sequences, wrong_every=3, draft_prob=draft_prob), AlwaysProbe()
    torch.manual_seed(11)
    out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=40, eos_token_id=[],
                                                          num_draft_tokens=policy, **sampling)
    assert torch.equal(out.sequences, plain.sequences)  # same forward, same draws: the probe changed nothing
    observed = [accepted for drafted, accepted, _ in policy.observed if drafted]
    with torch.no_grad():
        replayed = _replayed_outcomes(model, out.sequences, drafter.proposed, SamplingConfig(True, 1.3, 20, None),
                                      draft_prob)
    assert observed == replayed
    assert 0 < sum(observed) < len(observed) and out.stats.probes_accepted == sum(observed)  # both outcomes seen
    if draft_prob < 1:  # a planted wrong rule (u < p: q ignored, which equals the right one at q = 1) is told apart
        with torch.no_grad():
            planted = _replayed_outcomes(model, out.sequences, drafter.proposed, SamplingConfig(True, 1.3, 20, None),
                                         draft_prob, rule=lambda token, q, row, u: u < float(row[token]))
        assert planted != observed


def test_seeded_probes_are_accepted_exactly_when_they_equal_the_keyed_draw():
    """With a seed, a probe in shadow is scored as the keyed verifier scores a draft: accepted iff it equals the token
    the seed draws at its position; the tokens stay those of speculation off with the same seed.
    Catches (planted): the rejection rule's private uniform used for seeded probes (accepts some wrong drafts)."""
    model, prompt = tiny_model("llama", seed=5), random_prompt(10, seed=6)
    sampling = dict(do_sample=True, temperature=1.3, top_k=20)
    plain = SelfSpecModel(model, drafter="none").generate(prompt, max_new_tokens=40, seed=11, eos_token_id=[],
                                                          **sampling)
    drafter, policy = ScriptedDrafter(plain.sequences, wrong_every=3, draft_prob=0.5), AlwaysProbe()
    out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=40, seed=11, eos_token_id=[],
                                                          num_draft_tokens=policy, **sampling)
    assert torch.equal(out.sequences, plain.sequences)
    observed = [accepted for drafted, accepted, _ in policy.observed if drafted]
    expected = [int(int(tokens[0]) == int(out.sequences[0, start])) for start, tokens in drafter.proposed]
    assert observed == expected[: len(observed)] and len(observed) >= 30
    assert 0 < sum(observed) < len(observed) and out.stats.probes_accepted == sum(observed)


def test_probe_rule_accepts_with_probability_min_one_p_over_q():
    row = torch.tensor([0.1, 0.25, 0.65], dtype=torch.float64)
    grid = [(i + 0.5) / 1000 for i in range(1000)]
    for token, q in [(0, 0.5), (1, 0.25), (2, 0.3), (0, 1.0)]:
        rate = sum(probe_accepted(token, q, row, u) for u in grid) / len(grid)
        assert rate == pytest.approx(min(1.0, float(row[token]) / q), abs=2e-3)


@pytest.mark.parametrize("skip_probe_pass", [True, False])
def test_an_early_exit_probe_is_scored_in_shadow_and_its_first_layers_entries_cut(monkeypatch, skip_probe_pass):
    """Early exit's probe ran the first layers over the pending token (shared work): the step resumes after them for
    the pending token alone, so every later step sees the cache plain decoding would have: greedy output is the
    model's own. (Sampled, the drafter draws its probe from the user's generator, as any sampling drafter does, so its
    tokens are not speculation-off's: same law.) The engine tells the drafter the ask is such a probe
    (`DraftContext.probe`), so the probe token never runs the first layers: one partial pass per probe, not two. A
    drafter that runs it anyway (skip_probe_pass=False: `probe` ignored) has its entries cut, with the same output.
    Its steps resume after the drafted layers, so none is the full forward the cost curve learns from.
    Catches (planted): the probe token's first-layer entries kept (later tokens differ); such a step taught to the
    curve as a plain decode; `probe` not passed to the drafter (two passes per probe)."""
    model, prompt = tiny_model("llama", seed=5, num_layers=4), random_prompt(10, seed=6)
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2)
    curve = spec.verify_cost()
    passes, exit_forward, propose = [], spec.target.exit_forward, spec.drafter.propose
    monkeypatch.setattr(spec.target, "exit_forward", lambda *a: passes.append(1) or exit_forward(*a))
    if not skip_probe_pass:
        monkeypatch.setattr(spec.drafter, "propose", lambda context: propose(dataclasses.replace(context, probe=False)))
    out = spec.generate(prompt, max_new_tokens=16, num_draft_tokens=AlwaysProbe(), eos_token_id=[])
    assert curve.num_observed == 1  # only the last step: a plain decode (no budget left for a probe)
    assert torch.equal(out.sequences, greedy_reference(model, prompt, 16))
    assert out.stats.drafted == 0 and out.stats.probed == 14 and out.stats.target_forwards == 16
    assert 0 < out.stats.probes_accepted < out.stats.probed  # its early exit agrees with the model now and then
    assert len(passes) == (1 if skip_probe_pass else 2) * out.stats.probed


def test_auto_comes_back_to_drafting_through_accepted_shadow_probes():
    """Verifying one draft costs 1.7 decodes here, so at the prior's acceptance (0.5) "auto" does not draft; a drafter
    that is always right passes its probes in shadow, and then "auto" drafts and has its drafts accepted."""
    model, prompt = tiny_model("llama", seed=3), random_prompt(10, seed=4)
    expected = greedy_reference(model, prompt, 80)
    curve = VerifyCost((1.0, 1.7, 1.9, 2.1, 2.3, 2.5, 2.7, 2.9, 3.1))
    policy = AdaptiveDraftLength(curve, learn_step_cost=False)
    drafter = ScriptedDrafter(expected, wrong_every=0)
    out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=80, num_draft_tokens=policy,
                                                         eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    first_start, first_tokens = drafter.proposed[0]
    assert first_tokens.numel() == 1 and first_start > prompt.shape[1] + 1  # not drafting at first: a probe, later
    assert out.stats.probed >= 1 and out.stats.probes_accepted == out.stats.probed
    assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted  # then drafting, verified for real


def test_probes_are_verified_for_real_until_the_cost_of_one_draft_was_timed():
    """A learned curve that has not timed a forward verifying one draft must learn it from real probes (a pessimistic
    prior is otherwise never corrected): probe_in_shadow is True only once it knows k = 1 (two timed forwards), and
    a fixed curve (the prior of reproducible sampling, which learns nothing from timings) always scores in shadow.
    Catches (planted): probes scored in shadow from the start (True at the first probe)."""
    learned = LearnedVerifyCost(prior_verify_cost(torch.device("cpu")), path=None)
    policy = AdaptiveDraftLength(learned, learn_step_cost=False, prior_acceptance=0.0)

    def next_probe():
        while not policy.choose():
            policy.observe(0, 0)
        return policy.probe_in_shadow()

    assert next_probe() is False
    policy.observe(1, 0)
    learned.observe(1, 0.014)
    assert next_probe() is False
    policy.observe(1, 0)
    learned.observe(1, 0.014)
    assert next_probe() is True
    fixed = AdaptiveDraftLength(prior_verify_cost(torch.device("cpu")), prior_acceptance=0.0)
    while not fixed.choose():
        fixed.observe(0, 0)
    assert fixed.probe_in_shadow() is True
    assert policy.probe_in_shadow(full_forward=False) is True  # (early exit's resumed forward teaches no curve)


def test_what_was_timed_is_kept_with_the_curve(tmp_path):
    """The next process starts knowing what this one timed (so its probes are scored in shadow from the start)."""
    path = tmp_path / "curve.json"
    learned = LearnedVerifyCost(prior_verify_cost(torch.device("cpu")), path=path)
    for seconds in (0.010, 0.010, 0.015, 0.015):
        learned.observe(0 if seconds < 0.012 else 1, seconds)
    learned.save()
    kept = LearnedVerifyCost(verify_cost._read_curve(path), path=path)
    assert kept.knows(0) and kept.knows(1) and not kept.knows(2)
    path.write_text(json.dumps({"relative": [1.0, 1.4], "decode_seconds": 0.01}))  # kept by an older version
    assert not LearnedVerifyCost(verify_cost._read_curve(path), path=path).knows(1)


def test_a_batch_probe_is_verified_for_real_until_a_wider_forward_was_timed():
    planner = BatchDraftLength(prior_verify_cost(torch.device("cpu")), probe_every=2)
    useless = [(AdaptiveDraftLength(prior_verify_cost(torch.device("cpu")), prior_acceptance=0.0), 10)] * 4
    widths = []
    while len([w for w in widths if w]) < 3:
        widths.append(planner.choose(useless))
        if widths[-1]:
            # the first probe's forward, a new block shape, is a warm-up (untimed); the second times width 1
            assert planner.probe_in_shadow() is (len([w for w in widths if w]) > 2)
        planner.observe([widths[-1]] * 4, 0, 0.01, 0.01)


class AlternatingProbe:
    """Probes (one token, scored in shadow) on every other step, real drafts of 2 in between."""

    def __init__(self):
        self.steps = 0
        self.probing = False

    def choose(self) -> int:
        self.steps += 1
        self.probing = self.steps % 2 == 1
        return 1 if self.probing else 2

    def probe_in_shadow(self, full_forward=True) -> bool:
        return self.probing

    def observe(self, num_drafted, num_accepted, seconds=None):
        pass


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_heads_drafting_between_shadow_probes_stay_exact(drafter):
    """A probe scored in shadow leaves the drafter's state as a rejected draft would (EAGLE keeps its own cache of the
    head's keys and values; both drafters catch up on the states committed since their last proposal): greedy output
    stays the model's own, with real drafts accepted and rejected between the probes."""
    from tests.selfspec.exercised import assert_exercised, greedy_sequences
    from tests.selfspec.batch.test_decode import engine, prompts_of_different_lengths

    spec = engine("llama", drafter)
    for prompt in prompts_of_different_lengths()[:2]:
        out = spec.generate(prompt, max_new_tokens=30, num_draft_tokens=AlternatingProbe(), eos_token_id=[])
        (expected,) = greedy_sequences(spec.model, [prompt[None]], 30)
        assert torch.equal(out.sequences[0], expected)
        assert out.stats.probed > 0
        assert_exercised(out.stats, what=f"{drafter} between shadow probes")
