"""How many tokens a batch drafts each step: one width for every row, priced by what the batch's forward costs.

A batched step verifies every row's block padded to the widest one, so its forward runs over B * (1 + w) tokens
whatever shorter rows drafted; on a CPU that cost grows with the total, so a row's own policy, planning with the
single-sequence curve, over-drafts. `BatchDraftLength` chooses w to maximise the batch's expected tokens per unit of
cost, from each row's acceptance estimates (its `AdaptiveDraftLength`, observed by the decode loop) and a cost learned
from the batch's own timings. Knows no model, cache, drafter or clock: the loop hands it counts and seconds.
"""
from __future__ import annotations

from selfspec.draft_length import AdaptiveDraftLength, StepOverhead
from selfspec.verify_cost import LearnedVerifyCost, VerifyCost


class BatchDraftLength:
    """Choose one draft width w (0 .. max_draft_tokens) per step for the whole batch; row r drafts min(w, cap_r).

    Objective: sum_r row_r.expected_tokens(min(w, cap_r)) / step_cost, where step_cost, in one-token decodes of one
    row, is cost_curve(B * (1 + width) - 1) + overhead.per_step + overhead.per_token * sum_r min(w, cap_r), and width
    = max_r min(w, cap_r) is the padded block's draft part. `cost_curve` is a `LearnedVerifyCost` started from the
    single-sequence curve (a batch of B one-token rows priced as one row verifying B - 1 drafts: the same matmuls over
    the weights) and taught only by this batch's verify forwards; it has no path, so batch timings never reach the
    curve kept on disk. `overhead` learns the rest of each step (drafting, per-row verification, bookkeeping), so a
    drafter that costs per drafted token (EAGLE runs its head once per token, row by row) is priced too.

    Rows learn acceptance only when they draft, so after `probe_every` steps at w = 0 one step drafts w = 1 in every
    row (a probe), as `AdaptiveDraftLength` probes: a probe no row accepted doubles the wait for the next (up to
    `max_probe_every`), a width chosen on the evidence resets it. A probe costs B more tokens in the forward, so a
    useless drafter costs a handful of them per generation, not one every 8 steps. Defaults follow
    `AdaptiveDraftLength`'s (its replayed measurements).

    The cost's shape can only be learned from steps of different widths, and a batched forward is not shaped like
    one sequence's (measured on SmolLM2 at batch 8: each row's attention over its own cache makes the base cost far
    higher, so extra tokens cost relatively less): so after `explore_every` steps at the same width w > 0, one step
    runs at a neighbouring width (w - 1 and w + 1 in turn), a small price for a fit that can tell them apart.
    """

    def __init__(self, start: VerifyCost, max_draft_tokens: int = 8, probe_every: int = 8, max_probe_every: int = 64,
                 decay: float = 0.9, explore_every: int = 8):
        # total tokens - 1 -> one-row decodes; never saved. A weak pull towards the start's shape (a hundredth of a
        # step at one unit of extra cost): a batch is shaped unlike one sequence, and explored widths must show it.
        self.cost_curve = LearnedVerifyCost(start, path=None, prior_weight=0.01)
        self.overhead = StepOverhead(decay)
        self.max_draft_tokens = max_draft_tokens
        self.probe_every, self.max_probe_every = probe_every, max(probe_every, max_probe_every)
        self._probe_wait = probe_every  # steps at w = 0 before the next probe
        self._steps_at_zero = 0
        self._probing = False  # the width just chosen is a probe
        self.explore_every = explore_every
        self._last_width, self._same_width_steps, self._explore_up = 0, 0, False

    def step_cost(self, num_rows: int, width: int, num_drafted: int) -> float:
        """Expected cost of a step over num_rows blocks of 1 + width tokens proposing num_drafted drafts in all."""
        forward = self.cost_curve(num_rows * (1 + width) - 1)
        return forward + self.overhead.per_step + num_drafted * self.overhead.per_token

    def choose(self, rows: list[tuple[AdaptiveDraftLength, int]]) -> int:
        """rows: (the row's acceptance estimates, the most drafts it may take this step) -> the width w; the
        returned w never exceeds the largest cap (it is the padded block's draft part when the drafters deliver)."""
        best, best_rate = 0, 0.0
        for w in range(self.max_draft_tokens + 1):
            ks = [max(0, min(w, cap)) for _, cap in rows]  # what each row drafts at this width
            if w and max(ks) < w:  # capped: wider asks the same of every row
                break
            tokens = sum(policy.expected_tokens(k) for (policy, _), k in zip(rows, ks))
            rate = tokens / self.step_cost(len(rows), w, sum(ks))
            if rate > best_rate:
                best, best_rate = w, rate
        self._probing = False
        if best == 0:
            self._steps_at_zero += 1
            if self.probe_every and self._steps_at_zero >= self._probe_wait and any(cap > 0 for _, cap in rows):
                self._steps_at_zero, self._probing, best = 0, True, 1
        else:
            self._steps_at_zero, self._probe_wait = 0, self.probe_every
            best = self._explore(best, max(cap for _, cap in rows))
        return best

    def _explore(self, width: int, widest: int) -> int:
        """After `explore_every` steps at the same width w > 0, one step at w - 1 or w + 1 (in turn, within the
        rows' caps), so the timings cover more than one width."""
        self._same_width_steps = self._same_width_steps + 1 if width == self._last_width else 1
        self._last_width = width
        if not self.explore_every or self._same_width_steps < self.explore_every:
            return width
        self._same_width_steps, self._explore_up = 0, not self._explore_up
        wider = width + 1 if width < min(widest, self.max_draft_tokens) else width - 1
        return wider if self._explore_up else width - 1

    def observe(self, drafted: list[int], num_accepted: int, verify_seconds: float, step_seconds: float) -> None:
        """A step ended: drafted[r] tokens were proposed by row r (rows in the forward, in any order), num_accepted
        of all of them were accepted, its verify forward (padded to 1 + max drafted tokens per row, and the logits)
        took verify_seconds, the whole step step_seconds."""
        if self._probing and any(drafted) and not num_accepted:  # a rejected probe doubles the wait for the next
            self._probe_wait = min(2 * self._probe_wait, self.max_probe_every)
        self._probing = False
        total_tokens = len(drafted) * (1 + max(drafted))
        self.cost_curve.observe(total_tokens - 1, verify_seconds)
        decode_seconds = self.cost_curve.decode_seconds  # > 0 once a forward was timed
        if decode_seconds > 0:
            self.overhead.observe(sum(drafted), max(0.0, step_seconds - verify_seconds) / decode_seconds)
