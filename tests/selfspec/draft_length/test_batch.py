"""The batch's draft width: priced by the padded forward over B * (1 + w) tokens, drafting where acceptance pays for
it, within each row's budget, probing when off, learning its costs from the batch's own timings; through the engine
it changes how fast, never which tokens (greedy rows equal each prompt alone), and it is used only when no seed asks
for rows that plan alone.

Each test names the planted bugs it caught (planted in selfspec/draft_length/batch.py or selfspec/batch/decode.py, seen to
fail, reverted)."""
import pytest
import torch

import selfspec.batch.decode
from selfspec import SelfSpecModel
from selfspec.draft_length.batch import BatchDraftLength
from selfspec.draft_length.policy import AdaptiveDraftLength, StepOverhead
from selfspec.drafters.base import Draft
from selfspec.sampling import SamplingConfig
from selfspec.draft_length.verify_cost import BATCH_CURVE_SIZE, LearnedVerifyCost, VerifyCost, batch_cost_curve, prior_verify_cost
from tests.conftest import tiny_model
from tests.selfspec.exactness import exact_continuation_law, law_pvalue
from tests.selfspec.exercised import RecordingDrafter, assert_exercised, greedy_sequences
from tests.selfspec.scripted_time import scripted_batch_clock
from tests.selfspec.batch.test_decode import engine, prompts_of_different_lengths

CPU_LIKE = VerifyCost(tuple(1 + 0.15 * k for k in range(9)))  # linear: one more token costs 0.15 of a decode
NEARLY_FLAT = VerifyCost(tuple(1 + 0.01 * k for k in range(9)))  # a large GPU: dozens of tokens cost about one


def row(rate: float, cap: int = 8) -> tuple[AdaptiveDraftLength, int]:
    """A row whose every draft position is accepted with probability `rate` (as if after 1,000 observations),
    allowed `cap` drafts this step."""
    policy = AdaptiveDraftLength(CPU_LIKE, prior_acceptance=rate, learn_step_cost=False)
    policy.tried, policy.accepted = [1000.0] * 8, [1000.0 * rate] * 8
    return policy, cap


def priced(curve: VerifyCost, **kwargs) -> BatchDraftLength:
    """A planner that has timed every width, so its choice is its pricing alone (a fresh one grows its width one
    timed step at a time)."""
    planner = BatchDraftLength(curve, **kwargs)
    planner.widest_timed = planner.max_draft_tokens
    return planner


def test_the_padded_batch_is_priced_by_all_its_tokens():
    """Acceptance 0.5 on a CPU-like curve: one row drafts 2, but eight rows would pay for 8 * (1 + w) tokens, which
    their expected tokens do not repay, so the batch drafts nothing.
    Catches (planted): a step priced as one row's 1 + w tokens (w = 2 at batch 8)."""
    assert priced(CPU_LIKE).choose([row(0.5)]) == 2
    assert priced(CPU_LIKE).choose([row(0.5) for _ in range(8)]) == 0


def test_a_cheap_forward_and_good_drafts_draft_the_most():
    """Acceptance 0.9 on a nearly flat curve: 8 rows at w = 8 verify 72 tokens for about 1.7 decodes.
    Catches (planted): the widths searched stopping short of max_draft_tokens (w = 7)."""
    assert priced(NEARLY_FLAT).choose([row(0.9) for _ in range(8)]) == 8
    assert priced(NEARLY_FLAT).choose([row(0.9), row(0.1), row(0.9), row(0.1)]) == 8


def test_row_budgets_bound_the_width_and_what_it_gains():
    """Rows allowed 2 drafts: the width is 2, not 8 (the block is no wider). Three rows about to finish (cap 0) and
    one that may draft: the others' padding is paid for one row's gain, which does not repay it.
    Catches (planted): each row's gain counted at w, not at its cap (w = 1 with three finishing rows)."""
    assert priced(NEARLY_FLAT).choose([row(1.0, cap=2), row(1.0, cap=1)]) == 2
    assert priced(CPU_LIKE).choose([row(0.6) for _ in range(4)]) > 0
    assert priced(CPU_LIKE).choose([row(0.6, cap=0), row(0.6, cap=0), row(0.6, cap=0), row(0.6)]) == 0


def test_the_width_grows_one_timed_step_at_a_time():
    """A start curve that is far too cheap (a token of the block at 0.001 of a decode) and good drafts: priced alone,
    w = 8 at once; instead the width goes 1, 2, 3, ..., each timed before the next is priced, so when the device's
    real cost (0.45 a token) shows, the width has not gone past where it pays. Catches (planted): no limit (w = 8
    at the first step); the limit from the chosen width instead of the timed one (steps that draft less than asked
    would still grow it); a shape's first forward, a warm-up, counted as timed (1, 2, 3, 4)."""
    cheap = VerifyCost(tuple(1 + 0.001 * k for k in range(9)), decode_seconds=0.01)
    rows = [row(0.9) for _ in range(8)]
    assert priced(cheap).choose(rows) == 8
    planner = BatchDraftLength(cheap, explore_every=0)
    widths = []
    for _ in range(8):
        widths.append(planner.choose(rows))
        planner.observe([widths[-1]] * 8, 0, 0.01, 0.01)  # as cheap as the start said
    assert widths == [1, 1, 2, 2, 3, 3, 4, 4]  # each shape's first forward a warm-up, its second timed
    capped = BatchDraftLength(cheap, explore_every=0)
    for _ in range(3):
        assert capped.choose(rows) == 1
        capped.observe([0] * 8, 0, 0.01, 0.01)  # asked for 1, the rows' drafters proposed nothing


def test_probes_one_draft_after_steps_at_zero_backing_off_while_rejected():
    """Useless drafts: w = 0, but after 8 steps at 0 w = 1 so the rows keep learning acceptance; each probe doubles
    the wait (16, 32, 64), accepted or not (unlike one sequence's: a batch's probe costs every row a token); a width
    chosen on the evidence resets it to 8; never a probe when no row may draft.
    Catches (planted): no probe; the first probe at the 9th step (counter compared with >); no back-off; an accepted
    probe keeping the wait (on the reference model at batch 8 such probes every 8 steps cost 11 %),
    or resetting it; drafting on the evidence not resetting it; a probe when every cap is 0; no
    `min_gain` (every step times the same here, so w = 1 ties w = 0, and the curve's noise chose w = 1 from step 24)."""
    planner = BatchDraftLength(CPU_LIKE, probe_every=8, max_probe_every=64)

    def run(rows, num_steps, probe_accepted=()):
        """The widths of num_steps steps; the i-th step that drafts has a draft accepted iff probe_accepted[i]."""
        widths, outcomes = [], iter(probe_accepted)
        for _ in range(num_steps):
            width = planner.choose(rows)
            accepted = width > 0 and next(outcomes, False)
            planner.observe([width] * len(rows), int(accepted), 0.01, 0.01)
            widths.append(width)
        return widths

    useless, good = [row(0.0) for _ in range(4)], [row(0.9) for _ in range(4)]
    widths = run(useless, 152, probe_accepted=(False, False, True, False, False))
    assert [i for i, w in enumerate(widths) if w] == [7, 23, 55, 119] and max(widths) == 1
    assert run(good, 1) != [0]
    assert run(useless, 8) == [0] * 7 + [1]
    assert run([row(0.0, cap=0) for _ in range(4)], 70) == [0] * 70


def test_a_probe_budget_holds_costly_probes_to_its_share_of_plain_steps():
    """Useless drafts whose drafting costs (as it learns) three plain steps a probe: with probe_budget=0.02 the probes
    take at most ~2% of the time plain steps take (over 600 steps: 0.02 * 600 / 3 = 4, after the two the full credit
    allows at first); without it, the waits alone allow one every 64 steps. The forward's cost is the curve's, the
    drafting 3 steps' worth, in the scripted seconds the planner observes.
    Catches (planted): the budget ignored (the waits' 11 probes); a probe priced at 0 (as many)."""

    def run(planner, rows, num_steps):
        probes = 0
        for _ in range(num_steps):
            width = planner.choose(rows)
            drafting = 3 * 0.01 * CPU_LIKE(len(rows) - 1) if width else 0.0  # three plain steps of drafting
            forward = 0.01 * CPU_LIKE(len(rows) * (1 + width) - 1)
            planner.observe([width] * len(rows), 0, forward, forward + drafting)
            probes += width > 0
        return probes

    useless = [row(0.0) for _ in range(8)]
    budgeted = run(BatchDraftLength(CPU_LIKE, probe_every=8, max_probe_every=64, probe_budget=0.02), useless, 600)
    unlimited = run(BatchDraftLength(CPU_LIKE, probe_every=8, max_probe_every=64), useless, 600)
    assert 1 <= budgeted <= 2 + 4 < unlimited
    with pytest.raises(ValueError, match="probe_budget"):
        BatchDraftLength(CPU_LIKE, probe_budget=0.0)


def forward_seconds(num_tokens: int, decode: float = 0.01, per_token: float = 0.45) -> float:
    """A scripted device: a forward over num_tokens tokens (all rows together) in seconds."""
    return decode * (1 + per_token * (num_tokens - 1))


def test_learns_the_forward_cost_of_all_the_batchs_tokens():
    """Forwards that cost 3x the start curve's extra per token (0.45 vs 0.15), at batch sizes 4 and 2 and several
    widths: the curve learns the decode's seconds and the scale, and the planner then drafts less.
    Catches (planted): observed as one row's k = width - 1 (scale about 8, not 3)."""
    planner = priced(CPU_LIKE)
    rows = [row(0.7) for _ in range(2)]
    before = planner.choose(rows)
    for step in range(60):
        drafted = [step % 5, 0, 1, step % 3][: 4 - 2 * (step % 2)]  # 4 or 2 rows; the widest sets the block
        seconds = forward_seconds(len(drafted) * (1 + max(drafted)))
        planner.observe(drafted, 0, seconds, seconds)
    assert planner.cost_curve.decode_seconds == pytest.approx(0.01, rel=0.05)  # the ridge holds the scale back a little
    assert planner.cost_curve.scale == pytest.approx(3.0, rel=0.05)
    assert planner.overhead.per_step == pytest.approx(0.0, abs=1e-9)  # the step was all forward
    assert planner.choose(rows) < before


@pytest.mark.parametrize("start", ["tail", "prior"])
@pytest.mark.parametrize("explore_every", [8, 0])
def test_explores_neighbouring_widths_to_learn_a_cost_shaped_unlike_the_start(explore_every, start):
    """The start curve says a token of the block costs 0.03 of a decode (SmolLM2's single-sequence tail); the device
    charges 0.2 (a batched forward is shaped otherwise). Timings of one width cannot tell a costlier forward from
    costlier tokens; a step at a neighbouring width every 8 steps can, and the width falls to the true optimum, 0
    (8 rows accepting half their drafts: w = 0 gives 8 tokens for 2.4 decodes, w = 1 12 for 4, w = 2 14 for 5.6),
    probing now and then. Without exploring (explore_every=0) it stays at the start's choice: the case exists to
    show that. The same from this CPU's concave prior (1 + 0.4 sqrt(k)). Catches (planted): exploration never
    triggered; the concave prior used as the start unstraightened (its fit's intercept goes below zero and the
    curve stops learning: widths stay > 0)."""
    if start == "tail":
        curve, rate, per_token = VerifyCost(tuple(1 + 0.03 * k for k in range(9))), 0.5, 0.2
    else:  # the prior is steeper: better drafts and a costlier device make the same case
        curve, rate, per_token = prior_verify_cost(torch.device("cpu")), 0.7, 0.4
    planner = BatchDraftLength(curve, explore_every=explore_every)
    rows = [row(rate) for _ in range(8)]
    g = torch.Generator().manual_seed(0)
    widths = []
    for _ in range(200):
        w = planner.choose(rows)
        accepted = sum(int(torch.rand(w, generator=g).lt(rate).cumprod(0).sum()) if w else 0 for _ in rows)
        seconds = 0.01 * (1 + per_token * (8 * (1 + w) - 1))
        planner.observe([w] * 8, accepted, seconds, seconds)
        widths.append(w)
    assert widths[0] >= 1
    if explore_every:
        assert widths[-60:].count(0) >= 50 and max(widths[-60:]) == 1  # off, but for probes
    else:
        assert min(widths[-60:]) >= 1


def test_learns_what_each_drafted_token_costs():
    """A flat forward (0.01 s at any width) and 0.004 s per drafted token outside it (drafting row by row) plus
    0.001 s per step: per draft token 0.4 decodes, per step 0.1, learned from the step's time beyond its forward;
    drafting then stops paying for 4 rows at acceptance 0.5 (it did while drafts were free).
    Catches (planted): the overhead given the whole step's seconds (per step 1.1); charged per draft token as w,
    not as the tokens drafted (w > 0 after learning)."""
    planner = priced(VerifyCost((1.0,) * 9, decode_seconds=0.01))
    rows = [row(0.5) for _ in range(4)]
    assert planner.choose(rows) == 8
    for step in range(60):
        drafted = [step % 4, step % 3, 0, 1]
        planner.observe(drafted, 0, 0.01, 0.01 + 0.004 * sum(drafted) + 0.001)
    # (StepOverhead's ridge, worth one step against ~10 remembered ones, shifts a little per token to per step)
    assert planner.overhead.per_token == pytest.approx(0.4, rel=0.1)
    assert planner.overhead.per_step == pytest.approx(0.1, abs=0.1)
    assert planner.choose(rows) == 0


@pytest.mark.parametrize("case", ["drafter call", "overstated acceptance"])
def test_measured_rates_overrule_a_model_that_prices_drafting_too_low(case):
    """Two ways the model can price drafting too low at batch 8, each brought down to w = 0 (probing now and then).
    "drafter call": the forward costs what the curve says, but every drafting step also pays 0.03 s for the drafter's
    call whatever it drafts (not shaped per step + per token), so rows accepting 70 % emit most tokens per second at
    w = 0 (8 tokens in 0.0205 s, w = 2 17.5 in 0.0745 s): explorations that include w = 0 measure it. "overstated
    acceptance": the rows' estimates say 70 % but the drafts are accepted 15 % of the time (estimates lag, or the
    prior still holds them up), so the model keeps drafting; the rates measured per width overrule it. (Shadow probes
    cost nothing extra in the second case, so only the first tells whether they were counted.)
    Catches (planted): explorations never at w = 0 ("drafter call"); no step down to the width measured fastest
    ("overstated acceptance"); rates counted for shadow probes' steps (the assert on w = 0's rate)."""
    accepted_rate, call_seconds = (0.7, 0.03) if case == "drafter call" else (0.15, 0.0)
    planner = BatchDraftLength(CPU_LIKE)
    rows = [row(0.7) for _ in range(8)]
    g = torch.Generator().manual_seed(0)
    widths = []
    for _ in range(300):
        w = planner.choose(rows)
        forward_width = 0 if planner.probe_in_shadow() else w
        accepted = sum(int(torch.rand(forward_width, generator=g).lt(accepted_rate).cumprod(0).sum()) for _ in rows)
        verify = 0.01 * CPU_LIKE(8 * (1 + forward_width) - 1)
        planner.observe([forward_width] * 8, accepted, verify, verify + (call_seconds if w else 0.0))
        widths.append(w)
    assert max(widths[:20]) >= 1  # the model drafted first
    assert widths[-100:].count(0) >= 85  # off, but for probes and, every 64 steps, a few steps re-measuring w > 0
    assert planner.measured_rate(8, 0) == pytest.approx(8 / (0.01 * CPU_LIKE(7)), rel=1e-6)  # no probe counted
    assert any(planner.measured_rate(8, w) for w in range(1, 9))  # wider widths were measured, and slower
    assert all(planner.measured_rate(8, w) is None or planner.measured_rate(8, w) < planner.measured_rate(8, 0)
               for w in range(1, 9))


def test_measured_rates_need_two_steps_and_are_forgotten_when_stale():
    """A shape's rate counts from its second timed step and is forgotten `forget_after` timed steps after it last
    ran, so a width overruled long ago gets tried again (at w = 0 nothing else re-measures it).
    Catches (planted): rates never forgotten; a rate from one step."""
    planner = BatchDraftLength(CPU_LIKE, forget_after=10)
    planner.seen_shapes |= {(4, 1), (4, 3)}  # (no warm-ups)
    planner.observe([2, 1, 0, 2], 3, 0.01, 0.02)
    assert planner.measured_rate(4, 2) is None  # one step: not yet a rate
    planner.observe([2, 2, 0, 2], 1, 0.01, 0.02)
    assert planner.measured_rate(4, 2) == pytest.approx((0.9 * 7 + 5) / (0.9 * 0.02 + 0.02))
    for _ in range(10):
        planner.observe([0, 0, 0, 0], 0, 0.01, 0.01)
    assert planner.measured_rate(4, 2) is not None and planner.measured_rate(4, 0) == pytest.approx(400)
    planner.observe([0, 0, 0, 0], 0, 0.01, 0.01)
    assert planner.measured_rate(4, 2) is None  # 11 timed steps since it last ran


def test_a_price_held_too_high_is_timed_again_at_this_number_of_rows():
    """A kept batch curve prices 16, 24 and 32 forward tokens at 3.35 / 3.9 / 3.83 decodes (timed by
    earlier batches of other rows, at costs this device no longer shows: it costs 1 + 0.06 per token beyond one), and
    rows accept 60 %, so at 8 rows w = 1 emits 12.8 tokens in 1.9 decodes against w = 0's 8 in 1.42. The batch
    drafts: a probe at 8 rows is verified for real until 8 rows at width 1 were timed here, and then scored in
    shadow; each timed total's first timing replaces its kept price.
    Catches (planted): probes scored in shadow once any forward of their total was timed, by any rows, here or in a
    kept curve (every probe in shadow, w = 0 to the end)."""
    def device(total_tokens: int) -> float:
        return 0.01 * (1 + 0.06 * (total_tokens - 1))

    relative = [1 + 0.06 * k for k in range(BATCH_CURVE_SIZE)]
    relative[15], relative[23], relative[31] = 3.35, 3.9, 3.83
    timed = [0] * BATCH_CURVE_SIZE
    timed[7] = timed[15] = timed[23] = timed[31] = 100
    planner = BatchDraftLength(cost_curve=batch_cost_curve(VerifyCost(tuple(relative), 0.01, tuple(timed))))
    rows = [row(0.6) for _ in range(8)]
    widths, shadow = [], []
    for _ in range(100):
        widths.append(planner.choose(rows))
        shadow.append(planner.probe_in_shadow())
        forward_width = 0 if shadow[-1] else widths[-1]
        seconds = device(8 * (1 + forward_width))
        planner.observe([forward_width] * 8, int(0.6 * 8 * forward_width), seconds, seconds)
    assert widths[-30:].count(0) <= 5 and not any(shadow)  # drafting (w = 0 only to explore), no probe needed
    assert planner.cost_curve(15) == pytest.approx(1.9, rel=0.1)
    planner.probes.probing = True  # (as during a probe)
    assert planner.probe_in_shadow()  # 8 rows at width 1: timed here, recently
    planner.choose(rows[:4])
    planner.probes.probing = True
    assert not planner.probe_in_shadow()  # 4 rows at width 1: never timed here


def test_batch_rows_learn_that_their_drafter_declines(monkeypatch):
    """Under the batch's width the rows' policies do not choose, so they are told what each row's drafter was asked
    for: a drafter that proposes nothing for half the rows is priced as declining half the time, not as a drafter
    whose every ask brings a draft (measured on the reference model at batch 8, Medusa heads below their confidence
    floor in a third of the rows: the planner expected 18.3 tokens a step at w = 4 for 14.8 realised, and drafted at
    0.6-0.87x of w = 0; told, it stays at w = 0 but for probes, as fast as w = 0).
    Catches (planted): the rows' policies not told (their decline rate stays 0)."""

    class HalfDeclining:
        def __init__(self, inner):
            self.inner, self.asked = inner, 0

        def propose(self, context):
            self.asked += 1
            return self.inner.propose(context) if self.asked % 2 else Draft.empty(context.token_ids.device)

        def observe(self, num_drafted, num_accepted):
            self.inner.observe(num_drafted, num_accepted)

    recorded = _Recorded(monkeypatch)
    spec = engine("llama", "ngram")
    spec.drafter = HalfDeclining(spec.drafter)
    scripted_batch_clock(spec, monkeypatch, lambda num_tokens: 1.0)  # flat: the planner drafts every step
    spec.generate(prompts_of_different_lengths(), max_new_tokens=30, eos_token_id=[])
    (planner,) = recorded.batches
    assert spec.drafter.asked > 10
    assert all(0.3 < policy.decline_rate() < 0.9 for policy, _ in planner.rows)


class _Recorded:
    """Patches the engine's BatchDraftLength with one that records each step's (width, caps), per batch."""

    def __init__(self, monkeypatch):
        self.batches = []
        record = self.batches

        class Recording(BatchDraftLength):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.steps = []
                record.append(self)

            def choose(self, rows):
                width = super().choose(rows)
                self.steps.append((width, [cap for _, cap in rows]))
                self.rows = rows  # the latest step's (row policy, cap)
                return width

        monkeypatch.setattr(selfspec.batch.decode, "BatchDraftLength", Recording)


@pytest.mark.parametrize("drafter", ["ngram", "eagle"])
def test_greedy_rows_under_the_batch_width_equal_each_prompt_alone(drafter, monkeypatch):
    """Greedy "auto" (not reproducible): the planner chooses the width, on a scripted flat device (and a flat start
    curve, as each block shape's first forward is not timed) so it drafts much;
    every row still equals the model's own greedy decoding, drafts were accepted and rejected, and (n-gram, one
    drafter serving all rows) every row was asked for exactly min(width, its budget).
    Catches (planted): every row asked for the whole width, past its budget (it overruns its buffer)."""
    recorded = _Recorded(monkeypatch)
    spec = engine("llama", drafter)
    if drafter == "ngram":
        spec.drafter = RecordingDrafter(spec.drafter)
    monkeypatch.setattr(spec, "verify_cost", lambda: LearnedVerifyCost(VerifyCost((1.0,) * 9)))  # flat from the start
    scripted_batch_clock(spec, monkeypatch, lambda num_tokens: 1.0)
    prompts = prompts_of_different_lengths()
    out = spec.generate(prompts, max_new_tokens=30, eos_token_id=[])
    expected = greedy_sequences(spec.model, [p[None] for p in prompts], 30)
    for got, plain in zip(out.sequences, expected):
        assert torch.equal(got, plain)
    assert_exercised(out.row_stats, what=f"{drafter} batch width")
    assert out.stats.new_tokens == 4 * 30 and out.stats.drafted == sum(s.drafted for s in out.row_stats)
    (planner,) = recorded.batches
    assert len(planner.steps) == out.stats.target_forwards - 1  # one choice per step (not the prefill)
    assert sum(width > 1 for width, _ in planner.steps) > len(planner.steps) // 2
    if drafter == "ngram":
        asked = [min(width, cap) for width, caps in planner.steps for cap in caps if min(width, cap) > 0]
        assert [a for a, _ in spec.drafter.steps] == asked


def test_the_width_follows_the_batchs_timings(monkeypatch, tmp_path):
    """From a CPU-like start curve: on a flat device the batch learns that width is free and drafts up to the rows'
    budgets (at most 8), growing to them; on one where every token costs a whole decode (drafting never pays) it
    learns that and stops, but for a few one-draft probes. The tokens are the same.
    Catches (planted): no timings observed (the flat device's widths stay at the start curve's 1-2)."""
    prompts, steps, sequences = prompts_of_different_lengths(), {}, {}
    for device, seconds in (("flat", lambda n: 1.0), ("steep", lambda n: float(n))):
        monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path / device))  # two devices: neither finds the other's curve
        recorded = _Recorded(monkeypatch)
        spec = engine("llama", "ngram")
        monkeypatch.setattr(spec, "verify_cost", lambda: LearnedVerifyCost(CPU_LIKE))
        scripted_batch_clock(spec, monkeypatch, seconds)
        sequences[device] = spec.generate(prompts, max_new_tokens=80, eos_token_id=[]).sequences
        (planner,) = recorded.batches
        steps[device] = planner.steps[len(planner.steps) // 2 :]  # (width, caps) once the costs are learned
    assert all(torch.equal(a, b) for a, b in zip(sequences["flat"], sequences["steep"]))
    # Within one of the rows' budgets: the width grows one timed step at a time (each block shape's first forward
    # untimed), n-gram rows often draft less than asked or nothing (so it climbs slowly), and with their declines
    # priced, w = 7 and 8 come close.
    full = [width >= min(7, max(caps)) for width, caps in steps["flat"]]
    assert all(full[-5:]) and max(width for width, _ in steps["flat"]) == 8, str(steps["flat"])
    widths = [width for width, _ in steps["steep"]]
    assert max(widths) == 1 and widths.count(1) <= len(widths) // 8 + 1, widths


def test_a_batch_starts_from_what_earlier_batches_timed(monkeypatch):
    """The batch curve is the wrapper's (`batch_verify_cost`), kept between its batches and on disk: on a flat device
    the first batch grows its width one timed step at a time; the next one, of the same wrapper or of a new wrapper
    (as a new process finds the kept curve), starts at the widths the first one timed. Same tokens.
    Catches (planted): a private curve per batch (every batch starts again at width 1)."""
    prompts = prompts_of_different_lengths()
    recorded = _Recorded(monkeypatch)
    spec = engine("llama", "ngram")
    monkeypatch.setattr(spec, "verify_cost", lambda: LearnedVerifyCost(CPU_LIKE))
    scripted_batch_clock(spec, monkeypatch, lambda n: 1.0)
    first = spec.generate(prompts, max_new_tokens=80, eos_token_id=[]).sequences
    again = spec.generate(prompts, max_new_tokens=80, eos_token_id=[]).sequences
    new_wrapper = engine("llama", "ngram")
    scripted_batch_clock(new_wrapper, monkeypatch, lambda n: 1.0)
    kept = new_wrapper.generate(prompts, max_new_tokens=80, eos_token_id=[]).sequences
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, again, kept))
    assert len(recorded.batches) == 3
    first_widths, *later = ([width for width, _ in batch.steps] for batch in recorded.batches)
    grown = [b - a for a, b in zip(first_widths, first_widths[1:]) if b > a]
    assert first_widths[0] <= 1 and max(grown) == 1 and max(first_widths) >= 7, first_widths  # one step at a time
    assert all(min(widths[:5]) >= 5 for widths in later), later
    assert new_wrapper.batch_verify_cost().path == spec.batch_verify_cost().path
    assert new_wrapper.batch_verify_cost().path != SelfSpecModel(spec.model, drafter="ngram").verify_cost().path


def test_a_planner_prices_drafting_with_the_overhead_it_is_given_from_its_first_step():
    """Eight rows accepting 0.9 on a nearly flat curve draft the widest when drafting costs nothing beyond the
    forward; given an overhead learned at 0.3 one-row decodes per drafted token (a drafter and per-row verification
    that cost what the reference model's do at batch 8, 0.1, three times over), the same planner drafts
    nothing from its first step.
    Catches (planted): the given overhead ignored (a fresh one per planner)."""
    overhead = StepOverhead(0.9)
    for _ in range(20):
        overhead.observe(0, 0.2)
        overhead.observe(16, 0.2 + 16 * 0.3)
    assert overhead.per_token == pytest.approx(0.3, rel=0.05)
    rows = [row(0.9) for _ in range(8)]
    assert priced(NEARLY_FLAT).choose(rows) == 8
    assert priced(NEARLY_FLAT, overhead=overhead).choose(rows) == 0


def test_a_wrappers_batches_share_what_their_steps_cost_beyond_the_forward(monkeypatch):
    """Each batch's planner learns into the wrapper's `batch_step_overhead`, so the next batch starts from what the
    earlier ones learned (as from their cost curve) instead of pricing drafting at 0 per token. Same tokens.
    Catches (planted): a fresh overhead per batch (the second planner's is not the first's)."""
    prompts = prompts_of_different_lengths()
    recorded = _Recorded(monkeypatch)
    spec = engine("llama", "ngram")
    first = spec.generate(prompts, max_new_tokens=24, eos_token_id=[]).sequences
    learned = spec.batch_step_overhead()
    assert learned.n > 0  # the first batch's timed steps taught it
    again = spec.generate(prompts, max_new_tokens=24, eos_token_id=[]).sequences
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert [planner.overhead for planner in recorded.batches] == [learned, learned]
    assert SelfSpecModel(spec.model, drafter="ngram").batch_step_overhead() is not learned  # one per wrapper


def test_a_wrappers_batches_share_their_measured_rates(monkeypatch):
    """Each batch's planner measures into the wrapper's `batch_rates`, so the next batch starts from the rates earlier
    ones measured (when each call re-measured them, and "auto" trailed no drafts by 3-7 % on the reference
    model). Same tokens. Catches (planted): a fresh MeasuredRates per batch (the second planner's is not the
    first's)."""
    prompts = prompts_of_different_lengths()
    recorded = _Recorded(monkeypatch)
    spec = engine("llama", "ngram")
    first = spec.generate(prompts, max_new_tokens=24, eos_token_id=[]).sequences
    rates = spec.batch_rates()
    assert rates.counts and rates.timed_steps > 0  # the first batch's timed steps measured it
    timed = rates.timed_steps
    again = spec.generate(prompts, max_new_tokens=24, eos_token_id=[]).sequences
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert [planner.rates for planner in recorded.batches] == [rates, rates] and rates.timed_steps > timed
    assert SelfSpecModel(spec.model, drafter="ngram").batch_rates() is not rates  # one per wrapper


def test_a_planner_starts_from_the_rates_it_is_given():
    """Rates measured by an earlier batch overrule the next planner's model from its first choice: w = 2 measured
    slower than w = 0 at 4 rows, the model's ask of w = 3 becomes w = 0 (a fresh planner would take it)."""
    earlier = BatchDraftLength(CPU_LIKE)
    earlier.seen_shapes |= {(4, 1), (4, 3)}  # (no warm-ups)
    for _ in range(2):
        earlier.observe([0, 0, 0, 0], 0, 0.01, 0.01)  # 400 tokens per second
        earlier.observe([2, 2, 2, 2], 2, 0.01, 0.03)  # 200
    later = BatchDraftLength(CPU_LIKE, rates=earlier.rates)
    assert later.measured_rate(4, 0) == pytest.approx(400) and later._measured_down(3, 4) == 0
    assert BatchDraftLength(CPU_LIKE)._measured_down(3, 4) == 3


def test_unseeded_sampled_rows_under_the_batch_width_follow_the_model_law(monkeypatch):
    """Sampling without a seed: the width depends on every row's acceptance, but is chosen before the step's draws,
    so each row still follows the model's law. 1,200 rows of one prompt on a 4-token vocabulary (batches of 40 on a
    flat start curve, so the planner drafts), compared with the exact law of a 3-token continuation.
    Catches (planted): the drafts verified greedily (p-value 0)."""
    model = tiny_model("llama", seed=0, vocab_size=4, hidden=16, num_layers=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    spec = SelfSpecModel(model, drafter="ngram")
    monkeypatch.setattr(spec, "verify_cost", lambda: LearnedVerifyCost(VerifyCost((1.0,) * 9)))
    scripted_batch_clock(spec, monkeypatch, lambda num_tokens: 0.01)  # widths follow no real clock: same draws each run
    recorded = _Recorded(monkeypatch)
    prompt = torch.tensor([3, 1, 2, 3, 1, 2])
    torch.manual_seed(0)
    samples, stats = [], []
    for _ in range(30):
        out = spec.generate([prompt] * 40, max_new_tokens=3, do_sample=True, temperature=0.9, eos_token_id=[])
        samples += [tuple(s[prompt.shape[0]:].tolist()) for s in out.sequences]
        stats += out.row_stats
    assert len(recorded.batches) == 30 and any(width for width, _ in recorded.batches[0].steps)
    assert_exercised(stats, what="unseeded batched law")
    law = exact_continuation_law(model, prompt[None], 3, SamplingConfig(True, 0.9))
    assert law_pvalue(samples, law) > 1e-3


def test_used_for_auto_with_or_without_a_seed(monkeypatch):
    """An int keeps each row's fixed k: no batch planner; greedy and sampling with "auto" get one, seeded or not (a
    seeded row's tokens are keyed by position, so the batch's widths cannot change them).
    Catches (planted): a planner for an int k; no planner for seeded sampling."""
    spec = SelfSpecModel(tiny_model("llama"), drafter="ngram")
    prompts = prompts_of_different_lengths()[:2]
    sampled = dict(do_sample=True, temperature=0.8, max_new_tokens=6, eos_token_id=[])
    for options, planned in ((dict(seed=3, **sampled), True), (dict(generator=torch.Generator(), **sampled), True),
                             (dict(num_draft_tokens=3, max_new_tokens=6), False), (dict(max_new_tokens=6), True),
                             (sampled, True)):
        recorded = _Recorded(monkeypatch)
        spec.generate(prompts, **options)
        assert len(recorded.batches) == int(planned), options


def test_a_width_is_not_tried_past_one_measured_slower():
    """Once w = 2 was measured slower than w = 0 at these rows, a model that asks w = 3 (never measured) gets w = 0;
    while the widest measured width is the fastest, an unmeasured wider one is still tried (how drafting starts).
    Measured on the reference model at batch 16: after w = 4 measured slower than w = 0 the model asked
    w = 5 and 6, and "auto" ran at 0.81x of k = 0. Catches (planted): the unmeasured width taken as asked."""
    planner = BatchDraftLength(CPU_LIKE)
    planner.seen_shapes |= {(4, 1), (4, 2), (4, 3)}  # (no warm-ups)
    for _ in range(2):
        planner.observe([0, 0, 0, 0], 0, 0.01, 0.01)  # 4 tokens in 0.01 s: 400 per second
    assert planner._measured_down(3, 4) == 3  # only w = 0 measured: it is the widest measured, and the fastest
    for _ in range(2):
        planner.observe([1, 1, 1, 1], 4, 0.01, 0.015)  # 8 tokens in 0.015 s: faster than w = 0
    assert planner._measured_down(3, 4) == 3
    for _ in range(2):
        planner.observe([2, 2, 2, 2], 2, 0.01, 0.03)  # 6 tokens in 0.03 s: slower than w = 0 and w = 1
    assert planner._measured_down(3, 4) == 1  # not tried past w = 2: the fastest measured instead
    assert planner._measured_down(2, 4) == 1 and planner._measured_down(1, 4) == 1 and planner._measured_down(0, 4) == 0
    assert planner._measured_down(3, 8) == 3  # other rows: nothing measured
