"""How many tokens a batch drafts each step: one width for every row, priced by what the batch's forward costs.

A batched step verifies every row's block padded to the widest one, so its forward runs over B * (1 + w) tokens
whatever shorter rows drafted; on a CPU that cost grows with the total, so a row's own policy, planning with the
single-sequence curve, over-drafts. `BatchDraftLength` chooses w to maximise the batch's expected tokens per unit of
cost, from each row's acceptance estimates (its `AdaptiveDraftLength`, observed by the decode loop) and a cost learned
from the batch's own timings. Knows no model, cache, drafter or clock: the loop hands it counts and seconds.
"""
from __future__ import annotations

from selfspec.draft_length.policy import AdaptiveDraftLength, ProbeSchedule, StepOverhead
from selfspec.draft_length.verify_cost import (  # noqa: F401  (straight: re-exported for older imports)
    LearnedVerifyCost, VerifyCost, batch_cost_curve, clipped, straight,
)


class BatchDraftLength:
    """Choose one draft width w (0 .. max_draft_tokens) per step for the whole batch; row r drafts min(w, cap_r).

    Objective: sum_r row_r.expected_tokens(min(w, cap_r)) / step_cost, where step_cost, in one-token decodes of one
    row, is cost_curve(B * (1 + width) - 1) + overhead.per_step + overhead.per_token * sum_r min(w, cap_r), and width
    = max_r min(w, cap_r) is the padded block's draft part. `cost_curve` is a `LearnedVerifyCost` over the padded
    forward's tokens - 1, taught only by batches' verify forwards (never the one-sequence curve kept on disk): the
    engine passes its own (`SelfSpecModel.batch_verify_cost`, kept between batches and processes, so a batch starts
    from what earlier ones timed); given only `start`, a private one started from a straight line through it (B
    one-token rows priced as one row verifying B - 1 drafts: the same matmuls over the weights). `overhead` learns the
    rest of each step (drafting, per-row verification, bookkeeping), so a drafter that costs per drafted token (EAGLE
    runs its head once per draft position; n-gram and user drafters propose row by row) is priced too.

    Rows learn acceptance only when they draft, so after `probe_every` steps at w = 0 one step drafts w = 1 in every
    row (a probe), as `AdaptiveDraftLength` probes, but every probe doubles the wait for the next (up to
    `max_probe_every`), accepted or not, and only a width chosen on the evidence resets it. A probe costs B more
    tokens in the forward and takes the masked path, while what its rows accept rarely shortens the batch (it runs
    until its longest row ends): on the reference model at batch 8 the probes of drafts that some row accepted, every
    8 steps, cost 11 % (0.92x of transformers' batched loop, 1.03x at a fixed w = 0); so a probe is scored in shadow
    (no wider forward) once its shape was timed recently (`probe_in_shadow`). The probe defaults (after 8 steps, up
    to 64, waits doubling as they were) are those one sequence's policy had before its probes came back sooner
    (`ProbeSchedule`), not measured for batches; `explore_every` is a choice, not yet tuned.

    The cost's shape can only be learned from steps of different widths, and a batched forward is not shaped like
    one sequence's (measured on SmolLM2 at batch 8: each row's attention over its own cache makes the base cost far
    higher, so extra tokens cost relatively less): so after `explore_every` steps at the same width w > 0, one step
    runs at another width (w + 1, w - 1 and 0 in turn), a small price for a fit that can tell them apart.

    The fit is trusted one width past the widest it has timed, no further: a line fitted to a few narrow steps
    extrapolates badly (measured on the reference model at batch 8: after 6 steps at w <= 2 it priced w = 8 so low
    that 16 steps ran at w = 8, 0.63x of w = 0), so the width grows one step at a time and each width is timed
    before the next is priced; widths whose totals earlier batches timed (the curve's `was_timed`) count as timed.

    The model can still be wrong where a step's cost is not shaped as it assumes (a drafter's call that costs the same
    whatever it drafts; per-row work of a tiny model): on the reference model at batch 8 it chose w = 2 for a step
    that emitted 1.3x the tokens for 1.5x the time (fixed w = 2 ran at 0.85x of w = 0). So every timed
    step also counts, per (rows, width), the tokens it emitted and the seconds it took (decayed by `decay` whenever
    that shape is timed again), and a width gives way to the narrower one measured fastest at the same number of
    rows, if faster by more than `min_gain` (explorations measure w + 1, w - 1 and 0 in turn), and a width not yet
    measured is not tried past one measured slower than a narrower one: the model proposes, the measured rates
    overrule it. A rate needs two timed steps (one step's time is noise) and is forgotten `forget_after` timed steps
    after its shape last ran (caches grow, rows leave, acceptance drifts), so a width overruled long ago is tried
    again: at w = 0 only probes re-measure w = 1 (those verified for real). 64 is a choice, not measured.

    `overhead`: where the step's cost beyond its forward is learned; the engine passes its wrapper's, kept across
    batches as the curve is (`SelfSpecModel.batch_step_overhead`). A fresh one per batch priced drafting at 0 per
    drafted token until its steps taught otherwise: on the reference model at batch 8 (a drafting step 1.44-1.52x a
    plain one, ~0.1 one-row decodes per drafted token beyond the forward) each 96-token call drafted w = 2-5 for its
    first 30-40 steps.

    `rates`: where the measured rates are kept (`MeasuredRates`); the engine passes its wrapper's
    (`SelfSpecModel.batch_rates`), so a batch starts from what its wrapper's earlier batches measured: a fresh one
    per batch would re-measure them every call.

    `probe_budget`: probes spend at most this share of what plain steps cost (a probe priced as a step of width 1
    less a plain one, or as the last probe's step was timed beyond a plain one, whichever is more: the wider forward
    and every row's drafting, with its catch-up on the states the rows committed since the last proposal), as one
    sequence's probes do (`ProbeSchedule`'s budget); None: the waits alone limit them. The engine passes 0.02: `selfspec serve` at 8 rows of SmolLM2 over int8 products (two
    threads), where drafting never paid, ran 0.80x of speculation off with probes every 8-64 steps, each costing about
    three plain steps.

    `min_gain`: as `AdaptiveDraftLength`'s, a width > 0 only when expected at least this fraction faster than w = 0:
    the curve prices each total by what it timed (not kept non-decreasing, see `learned_batch_verify_cost`), so two
    totals that cost the same may differ by their noise, and a tie would otherwise draft useless tokens.
    """

    def __init__(self, start: VerifyCost | None = None, max_draft_tokens: int = 8, probe_every: int = 8,
                 max_probe_every: int = 64, decay: float = 0.9, explore_every: int = 8,
                 cost_curve: LearnedVerifyCost | None = None, min_gain: float = 0.02,
                 seen_shapes: set[tuple[int, int]] | None = None, forget_after: int = 64,
                 overhead: StepOverhead | None = None, rates: MeasuredRates | None = None,
                 probe_budget: float | None = None):
        if cost_curve is None:  # a private curve (total tokens - 1 -> one-row decodes), never saved
            if start is None:
                raise ValueError("BatchDraftLength needs a start curve or a cost_curve")
            cost_curve = batch_cost_curve(straight(start))
        self.cost_curve = cost_curve
        self.min_gain = min_gain  # a width > 0 only when expected this much faster than w = 0 (as one sequence's)
        # (rows, 1 + width) blocks whose first forward ran: later ones are measurements (shared with the cost curve's
        # other batches, like the engine's set for one sequence's draft sizes)
        self.seen_shapes = set() if seen_shapes is None else seen_shapes
        self.overhead = StepOverhead(decay) if overhead is None else overhead  # (the engine's: kept across batches)
        self.max_draft_tokens = max_draft_tokens
        self.probes = ProbeSchedule(probe_every, max_probe_every, accepted_resets=False, odd_waits=False)
        if probe_budget is not None and probe_budget <= 0:
            raise ValueError(f"probe_budget (a share of a plain step) must be > 0, got {probe_budget!r}")
        self.probe_budget = probe_budget
        self.probe_cost = 0.0  # what the last probe step cost beyond a plain one, in one-row decodes (as timed)
        self.explore_every = explore_every
        self._last_width, self._same_width_steps, self._explore_turn = 0, 0, 0
        self.widest_timed = 0  # the widest block (drafts per row) a timed step of this batch has verified
        self._num_rows = 0  # rows at the last choice
        # what each (rows, width) emitted per second (the engine's: kept across its batches, like the overhead)
        self.rates = MeasuredRates(decay, forget_after) if rates is None else rates

    def probe_in_shadow(self, full_forward: bool = True) -> bool:
        """Whether the width the last choose() returned is a probe whose one-token drafts are scored in shadow
        against plain decoding's forward (`verify_step.score_probe`), so it does not widen the batch's forward: only
        once a step of as many rows at width 1 was timed in the last `forget_after` timed steps (`rates`: this
        wrapper's batches). Until then a probe is verified for real: it is how the cost curve learns what a wider
        forward costs, and how it corrects a price it holds from elsewhere. A total timed only by other shapes or by
        other processes is not enough: a price held too high was otherwise never timed again (SmolLM2's
        kept curve priced 15 + 1 tokens at 3.35 one-row decodes, from a batch of 16 rows; at 8 rows every probe was
        scored in shadow, so w = 1 was never timed there). Batches verify full forwards only (`full_forward` is for
        the policies' common signature)."""
        return self.probes.probing and self.rates.timed_recently(self._num_rows, 1)

    def _trusted(self, width: int) -> bool:
        """Whether a step this wide was timed: in this batch (at any number of rows), or a forward of the same total
        tokens by any batch that taught the curve (it counts the forwards it timed per total, whatever their rows:
        8 rows at w = 1 and 16 at w = 0 are both 15)."""
        return width <= self.widest_timed or self.cost_curve.was_timed(self._num_rows * (1 + width) - 1)

    def step_cost(self, num_rows: int, width: int, num_drafted: int) -> float:
        """Expected cost of a step over num_rows blocks of 1 + width tokens proposing num_drafted drafts in all."""
        forward = self.cost_curve(num_rows * (1 + width) - 1)
        return forward + self.overhead.per_step + num_drafted * self.overhead.per_token

    def choose(self, rows: list[tuple[AdaptiveDraftLength, int]]) -> int:
        """rows: (the row's acceptance estimates, the most drafts it may take this step) -> the width w; the
        returned w never exceeds the largest cap (it is the padded block's draft part when the drafters deliver)."""
        best, best_rate, self._num_rows = 0, 0.0, len(rows)
        widest = min(1, self.max_draft_tokens)  # one width past the widest timed one
        while widest < self.max_draft_tokens and self._trusted(widest):
            widest += 1
        expected = [policy.expected_tokens_up_to(widest) for policy, _ in rows]  # [row][k]
        for w in range(widest + 1):
            ks = [max(0, min(w, cap)) for _, cap in rows]  # what each row drafts at this width
            if w and max(ks) < w:  # capped: wider asks the same of every row
                break
            tokens = sum(row_expected[k] for row_expected, k in zip(expected, ks))
            rate = tokens / self.step_cost(len(rows), w, sum(ks))
            if rate > best_rate * (1.0 + self.min_gain if w and not best else 1.0):  # 1st w > 0 must beat w = 0 by it
                best, best_rate = w, rate
        best = self._measured_down(best, len(rows))
        if best:
            best = self._explore(best, max(cap for _, cap in rows))
        probe_cost = 0.0
        if self.probe_budget is not None:  # probes spend at most this share of the plain steps' cost
            plain = self.step_cost(len(rows), 0, 0)
            self.probes.budget = self.probe_budget * plain
            # (the overhead's fit forgets a probe's drafting over the plain steps between probes: the timed one holds)
            probe_cost = max(self.step_cost(len(rows), 1, len(rows)) - plain, self.probe_cost)
        return self.probes.after(best, may_probe=any(cap > 0 for _, cap in rows), probe_cost=probe_cost)

    def measured_rate(self, num_rows: int, width: int) -> float | None:
        """Tokens per second that timed steps of num_rows blocks of 1 + width tokens emitted (`MeasuredRates.rate`)."""
        return self.rates.rate(num_rows, width)

    def _measured_down(self, width: int, num_rows: int) -> int:
        """The width, or the narrower one whose steps at this number of rows were measured fastest, if faster by more
        than `min_gain`. A width not measured yet is tried only while the widest narrower one measured is also the
        fastest measured (within `min_gain`): once a width was measured slower than a narrower one, wider ones (more
        tokens in the forward, more drafting) are not tried on the model's word (the reference model at
        batch 16: after w = 4 measured slower than w = 0, the model still asked w = 5 and 6, and "auto" ran at 0.81x
        of k = 0)."""
        rates = [(rate, w) for w in range(width + 1) if (rate := self.measured_rate(num_rows, w)) is not None]
        if not rates:
            return width
        # rates[-1] is the widest measured (the width itself, when measured); a narrower one overrules it only when
        # faster by more than `min_gain` (a tie is noise: with probes timing each number of rows, equal
        # rates of w = 0 and 1 from useless drafts' probes went to w = 0 by a rounding error, when rows turned good)
        fastest = max(rates)
        return width if fastest[0] <= rates[-1][0] * (1.0 + self.min_gain) else fastest[1]

    def _explore(self, width: int, widest: int) -> int:
        """After `explore_every` steps at the same width w > 0, one step at w + 1, then w - 1, then 0 (in turn; up
        only within the rows' caps), so the timings cover more than one width and the measured rates include no
        drafts at all."""
        self._same_width_steps = self._same_width_steps + 1 if width == self._last_width else 1
        self._last_width = width
        if not self.explore_every or self._same_width_steps < self.explore_every:
            return width
        self._same_width_steps, self._explore_turn = 0, (self._explore_turn + 1) % 3
        if self._explore_turn == 1 and width < min(widest, self.max_draft_tokens):
            return width + 1
        return 0 if self._explore_turn == 0 else width - 1

    def observe(self, drafted: list[int], num_accepted: int, verify_seconds: float, step_seconds: float,
                full_forward: bool = True) -> None:
        """A step ended: drafted[r] tokens were proposed by row r (rows in the forward, in any order), num_accepted
        of all of them were accepted, its verify forward (padded to 1 + max drafted tokens per row, and the logits)
        took verify_seconds, the whole step step_seconds. The first forward of each block shape [rows, 1 + width]
        is a warm-up, not a measurement (a GPU selects kernels for each new shape: 70-1200 ms against 5-8 ms after on
        an H200, engine.py), so it teaches neither the curve (which keeps what it learns) nor the overhead.
        full_forward False: the verify forward ran only the layers after early exit's drafted ones, so it is not a
        price of the curve's; the overhead then learns the step beyond the curve's price of a full forward (the
        drafting passes less the layers they spared verification), so the planner still prices the whole step."""
        shadow_probe = self.probe_in_shadow()  # (its drafter ran, its forward did not widen: neither width's rate)
        probe = self.probes.probing
        self.probes.observed(num_accepted)
        shape = (len(drafted), 1 + max(drafted))
        if shape not in self.seen_shapes:
            self.seen_shapes.add(shape)
            return
        self.rates.tick()
        if not shadow_probe:  # each row's next token, and the drafts accepted
            self.rates.observe(len(drafted), max(drafted), len(drafted) + num_accepted, step_seconds)
        self.widest_timed = max(self.widest_timed, max(drafted))
        total_tokens = len(drafted) * (1 + max(drafted))
        if full_forward:
            self.cost_curve.observe(total_tokens - 1, verify_seconds)
        decode_seconds = self.cost_curve.decode_seconds  # > 0 once a forward was timed
        if decode_seconds > 0:
            if probe:
                self.probe_cost = max(0.0, step_seconds / decode_seconds - self.step_cost(len(drafted), 0, 0))
            forward_seconds = verify_seconds if full_forward else self.cost_curve(total_tokens - 1) * decode_seconds
            overhead = max(0.0, step_seconds - forward_seconds) / decode_seconds
            self.overhead.observe(sum(drafted), clipped(overhead, self.overhead.predict(sum(drafted))))


class MeasuredRates:
    """Tokens per second that timed batch steps emitted, per (rows, width): decayed sums of steps, tokens and seconds
    (decayed by `decay` whenever that shape is timed again), a rate from a shape's second timed step on (one step's
    time is noise), forgotten `forget_after` timed steps (of any shape) after it last ran. The engine keeps one per
    wrapper (`SelfSpecModel.batch_rates`), shared by its batches as their cost curve and step overhead are, so a
    batch starts from the rates earlier ones measured instead of paying for them again (in memory only)."""

    def __init__(self, decay: float = 0.9, forget_after: int = 64):
        self.decay, self.forget_after = decay, forget_after
        self.timed_steps = 0
        # (rows, width) -> [decayed steps, decayed tokens emitted, decayed seconds, the timed step it last ran]
        self.counts: dict[tuple[int, int], list[float]] = {}

    def tick(self) -> None:
        """A timed step ran (of any shape; a shadow probe's too)."""
        self.timed_steps += 1

    def observe(self, num_rows: int, width: int, emitted: int, seconds: float) -> None:
        counts = self.counts.setdefault((num_rows, width), [0.0, 0.0, 0.0, 0])
        for i, value in enumerate((1.0, emitted, seconds)):
            counts[i] = self.decay * counts[i] + value
        counts[3] = self.timed_steps

    def timed_recently(self, num_rows: int, width: int) -> bool:
        """Whether a step of this shape was timed in the last `forget_after` timed steps."""
        counts = self.counts.get((num_rows, width))
        return counts is not None and self.timed_steps - counts[3] <= self.forget_after

    def rate(self, num_rows: int, width: int) -> float | None:
        """None for fewer than two such steps (a decayed count below 1.5), or none in the last `forget_after`."""
        if not self.timed_recently(num_rows, width):
            return None
        steps, tokens, seconds, _ = self.counts[(num_rows, width)]
        return tokens / seconds if steps >= 1.5 and seconds > 0 else None
