"""How many tokens to draft each step. A policy sees only how many drafts the verifier accepted and how many
seconds the step took (the decode loop times it and says so), never the tokens; so it cannot change what is
generated, only how fast.

`FixedDraftLength` always asks for the same number. `AdaptiveDraftLength` ("auto", the default) asks for the k that
maximises expected tokens per second: expected tokens per step (from decayed acceptance estimates per draft
position) over the step's cost (the device's cost of verifying k drafts, a curve from `verify_cost.py`, plus a
drafting cost learned from the step times it is given). Knows no model, cache or clock.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from selfspec.draft_length.verify_cost import (  # noqa: F401  (re-exported for older imports)
    VerifyCost, _non_decreasing, clipped, measure_verify_cost,
)

MAX_DRAFT_TOKENS = 8  # the most drafts "auto" plans for one step, unless the drafter proposes fewer


class CostCurve(Protocol):
    """k -> cost of verifying k drafts in one-token decodes; `decode_seconds` (0 while unknown) converts seconds."""

    decode_seconds: float

    def __call__(self, num_draft_tokens: int) -> float: ...


def curve_at(cost_curve: CostCurve, tokens: float) -> float:
    """The curve at a mean number of tokens verified, linear between the whole numbers around it."""
    below = int(tokens)
    part = tokens - below
    return cost_curve(below) if part == 0 else (1.0 - part) * cost_curve(below) + part * cost_curve(below + 1)


class FixedDraftLength:
    """Always ask for the same number of draft tokens (the drafter may still propose fewer)."""

    def __init__(self, num_draft_tokens: int):
        self.num_draft_tokens = num_draft_tokens

    def choose(self) -> int:
        return self.num_draft_tokens

    def observe(self, num_drafted: int, num_accepted: int, seconds: float | None = None) -> None:
        pass


class AdaptiveDraftLength:
    """Choose k each step to maximise expected tokens per second.

    Acceptance: position i's rate is P(draft i accepted | drafts before it accepted), estimated from decayed counts
    and shrunk towards position i-1's rate (position 0's towards `prior_acceptance`), so positions rarely tried
    borrow from their neighbour. The prior is worth `prior_weight` observations at first and decays like any old
    observation, so a drafter that is never right ends up estimated near 0, not at a floor the prior holds up.
    Expected tokens of a step with k drafts: 1 + sum_i prod_{j<=i} rate_j. Cost of that step, in one-token decodes:
    cost_curve(k) + overhead + k * draft_cost, where the last two are learned from the seconds `observe` is given
    for each step (`StepOverhead`): what a step costs beyond its verify forward, per step (the
    loop's bookkeeping) and per draft token (drafting itself: ~0 for n-gram, a partial forward for early exit);
    plain steps' overhead is learned apart from drafting steps' (`step_overhead`).
    Each position's evidence decays by `decay` whenever the position is observed again (a memory of about
    1 / (1 - decay) observations). A position the policy stopped drafting to is not observed at all, so its evidence
    would never change: a step that drafts d > 0 tokens ages the evidence of positions d and beyond by `stale_decay`,
    so while a position goes unseen its estimate drifts back towards its prior (its neighbour's rate), the faster the
    fewer times it was seen, and the position is tried again. Without it, a tree whose second level was rejected on
    its first few steps stayed one level deep for the rest of the generation (SmolLM2's EAGLE head: 48 of 53
    steps, 1.78 tokens per forward where the same prompt had given 2.40).
    At k=0 nothing is observed, so one draft token is tried anyway now and then (a probe, `ProbeSchedule`): after
    `probe_every` steps at k=0, the wait doubling (plus one step) up to `max_probe_every` while probes are rejected,
    back to the start once one is accepted or k > 0 is chosen on the evidence, and probes spending at most
    `probe_budget` of decoding (a probe costs drafting one token, `overhead.predict(1)`: a costly drafter is probed
    less often). A plain step ages every position's evidence and its prior alike (by `stale_decay`): the estimates
    stay, but the next probe weighs more, so after a long wait one accepted probe brings drafting back. A prompt that
    turns predictable is so drafted for again within about `max_probe_every` steps; waits of up to 64, kept by
    accepted probes, left the reference model's Medusa heads, rejected on their first steps, at 1.00 tokens per
    forward on a snippet of `accelerate` where a fixed k = 1 gave 1.33 (docs/draft-length.md).
    `verified_tokens`: k -> the most tokens a step drafting k verifies, when that is not k: a tree k levels deep
    verifies up to its node budget (the drafter's `max_tree_nodes`), so on a CPU a tree must earn its nodes. A step
    that tells `observe` how many it verified (`verified=`: a tree's nodes) teaches the price of its depth: k is
    priced at the decayed mean of what steps drafting k verified, a depth not drafted yet from the depths below it
    (`tokens_verified`). A tree that keeps only nodes above a probability floor verifies fewer than its budget
    (SmolLM2's trees of 16 with the 0.02 floor: ~8 of 16), and priced at its budget it was kept shallower than it
    paid to be.
    `draft_cost`: what drafting one token is expected to cost, in one-token decodes (a drafter's `draft_cost`, e.g.
    early exit's share of the model's weights it runs); the learned per-token overhead is pulled towards it rather
    than towards 0, so a costly drafter is not tried at length before timings come in.
    A drafter may decline (propose nothing although asked for k > 0: n-gram without a match, Medusa below its
    confidence floor). The policy remembers the k it last returned, and a step that asked and got no draft teaches
    a decayed decline rate d, not the acceptances: a step asking k is expected to give 1 + (1 - d) * (accepted
    drafts) tokens for (1 - d) * verify(k) + d * verify(0) + k * per-token cost (the drafter runs either way). Without
    it, heads that always declined (random Medusa heads when sampling) were asked at the prior's acceptance on every
    step, each ask paying the heads' forward for no token (0.89x of speculation off on the reference model).

    `min_gain`: k > 0 is chosen only when expected to be at least this fraction faster than k = 0. Where verifying one
    draft costs no more than decoding (SmolLM2 on one CPU thread: the learned curve had k = 1 at 1.00-1.03), any
    acceptance estimate above 0 made drafting look worth it, so a useless drafter was asked on ~50 of 128 steps while
    its estimate decayed towards 0 (random drafts: 0.87x of speculation off); 2 % stops it after ~20.

    Defaults (decay 0.9, prior 0.5 worth 4 observations, k <= 8) were chosen by replaying the reference model's
    greedy drafts through the policy (12 held-out prompts x 128 tokens, n-gram and early exit at layers 1, 2, 3, this
    CPU's cost ratios). Against the best fixed k of each case (which a user cannot know in advance) they reach 0.98x
    for n-gram and 1.04x for early exit (they turn drafting off where early exit does not pay); the best single fixed
    k (4) reaches 0.92x overall. A prior worth 1 gives up on bursty n-gram drafts too soon (0.92x), an optimistic 0.7
    worth 8 over-drafts the costlier early exit (0.98x). The probes' defaults (after 2 steps, waits of at most 15,
    1 % of decoding) were chosen the same way for the reference model's Medusa heads (40 prompts, chains of up to
    4): 0.96x of each prompt's best fixed k on average, where a probe after 8 steps backing off to 64 gave 0.91x
    (docs/draft-length.md).
    """

    def __init__(
        self,
        cost_curve: CostCurve,
        max_draft_tokens: int = MAX_DRAFT_TOKENS,
        prior_acceptance: float = 0.5,
        prior_weight: float = 4.0,
        decay: float = 0.9,
        probe_every: int = 2,
        learn_step_cost: bool = True,
        max_probe_every: int = 15,
        draft_cost: float = 0.0,
        verified_tokens: Callable[[int], int] | None = None,
        min_gain: float = 0.02,
        stale_decay: float = 0.95,
        probe_budget: float = 0.01,
    ):
        if (not 0 < decay <= 1 or not 0 < stale_decay <= 1 or prior_weight <= 0 or not 0 <= prior_acceptance <= 1
                or max_draft_tokens < 1):
            raise ValueError("need 0 < decay <= 1, 0 < stale_decay <= 1, prior_weight > 0, 0 <= prior_acceptance <= 1, "
                             "max_draft_tokens >= 1")
        if draft_cost < 0:
            raise ValueError(f"draft_cost (one-token decodes per draft token) must be >= 0, got {draft_cost!r}")
        if probe_budget <= 0:
            raise ValueError(f"probe_budget (a share of decoding) must be > 0, got {probe_budget!r}")
        self.cost_curve = cost_curve  # k -> verifying k drafts, in one-token decodes (may refine itself)
        self.max_draft_tokens = max_draft_tokens
        self.prior_acceptance = prior_acceptance
        self.prior_weight = prior_weight
        self.decay = decay
        self.stale_decay = stale_decay  # per step, for the evidence of positions the step did not draft to
        self.learn_step_cost = learn_step_cost
        self.verified_tokens = verified_tokens or (lambda k: k)  # k -> the most tokens a step verifies (tree: nodes)
        self.verified_steps = [0.0] * (max_draft_tokens + 1)  # [k] decayed count of steps drafting k that told verified
        self.verified_sum = [0.0] * (max_draft_tokens + 1)  # [k] of those, decayed sum of the tokens they verified
        self.min_gain = min_gain  # drafting must be expected this much faster than k = 0 (a fraction)
        self.tried = [0.0] * max_draft_tokens  # [position] decayed count of steps that proposed a draft there
        self.accepted = [0.0] * max_draft_tokens  # [position] of those, decayed count accepted
        self.prior_left = [prior_weight] * max_draft_tokens  # [position] what the prior is still worth
        # What a plain step (k = 0) costs beyond its forward, learned from plain steps (a mean); what a drafting step
        # costs beyond that, learned from drafting steps, and aged by plain steps back towards its priors (per token:
        # draft_cost; per step: 0), as they age unseen positions' acceptance (`step_overhead`).
        self.plain_overhead = StepOverhead(decay)
        self.overhead = StepOverhead(decay, per_token=draft_cost, step_ridge=1.0)
        self.probes = ProbeSchedule(probe_every, max_probe_every, budget=probe_budget)
        self.asked = self.declined = 0.0  # decayed counts of steps that asked for drafts, and of those that got none
        self._last_asked = 0  # the k the last choose() returned

    def acceptance(self) -> list[float]:
        """[position] estimated P(accepted | every earlier draft accepted)."""
        rates, prior = [], self.prior_acceptance
        for tried, accepted, weight in zip(self.tried, self.accepted, self.prior_left):
            if tried + weight > 0:  # (plain steps age both; after very many, both may round to 0)
                prior = (accepted + weight * prior) / (tried + weight)
            rates.append(prior)
        return rates

    def probe_in_shadow(self, full_forward: bool = True) -> bool:
        """Whether the k the last choose() returned is a probe (one draft although drafting did not pay on the
        evidence) for the engine to score in shadow, against plain decoding's forward, instead of verifying it (no
        wider forward, `verify_step.verify_in_shadow`); `observe` learns its outcome either way. full_forward: its
        real verification would be a full forward, the kind that teaches the cost curve; then not while the curve
        has still to time a forward verifying one draft (`LearnedVerifyCost.knows`), so a pessimistic start curve is
        corrected. An early-exit draft's verification resumes after its layers and teaches the curve nothing, and a
        fixed curve learns nothing from timings: their probes always are."""
        knows = getattr(self.cost_curve, "knows", None)
        return self.probes.probing and (not full_forward or knows is None or knows(1))

    def decline_rate(self) -> float:
        """Estimated P(the drafter proposes nothing | asked for k > 0); a prior worth one step at 0."""
        return self.declined / (self.asked + 1.0)

    def expected_tokens(self, num_draft_tokens: int) -> float:
        """Expected tokens a step emits when it asks for `num_draft_tokens` (accepted drafts + the next token)."""
        return self.expected_tokens_up_to(num_draft_tokens)[num_draft_tokens]

    def expected_tokens_up_to(self, max_draft_tokens: int) -> list[float]:
        """[k] expected_tokens(k) for k = 0 .. max_draft_tokens, in one pass (the policy runs every step)."""
        kept, expected, reach, tokens = 1.0 - self.decline_rate(), 0.0, 1.0, [1.0]
        for rate in self.acceptance()[:max_draft_tokens]:
            reach *= rate
            expected += reach
            tokens.append(1.0 + kept * expected)
        return tokens + [tokens[-1]] * (max_draft_tokens + 1 - len(tokens))  # past max_draft_tokens: no more drafts

    def tokens_verified(self, num_draft_tokens: int) -> float:
        """Expected tokens a step drafting k = `num_draft_tokens` verifies: what such steps verified (`observe`'s
        `verified`), with a prior worth one step: what steps drafting k - 1 are expected to verify plus what the
        (k - 1)-th level added to them, at most `verified_tokens(k)`. A depth not drafted yet is so priced from the
        depths below it, and a tree that drafted k - 1 levels for fewer nodes than its budget (a node floor) is
        expected to grow as it did, not to fill its budget. A chain's k stays k."""
        return self.tokens_verified_up_to(num_draft_tokens)[num_draft_tokens]

    def tokens_verified_up_to(self, max_draft_tokens: int) -> list[float]:
        """[k] tokens_verified(k) for k = 0 .. max_draft_tokens, in one pass (each depth is priced from the one
        before it; the policy prices every depth every step)."""
        before, expected, verified = 0.0, 0.0, [0.0]
        for k in range(1, max_draft_tokens + 1):
            most = self.verified_tokens(k)
            prior = most if k == 1 else min(most, 2 * expected - before)
            steps, total = (self.verified_steps[k], self.verified_sum[k]) if k <= self.max_draft_tokens else (0.0, 0.0)
            before, expected = expected, (total + prior) / (steps + 1.0)
            verified.append(expected)
        return verified

    def step_cost(self, num_draft_tokens: int) -> float:
        """Expected cost of a step asking for `num_draft_tokens`, in one-token decodes."""
        return self.step_costs_up_to(num_draft_tokens)[num_draft_tokens]

    def step_costs_up_to(self, max_draft_tokens: int) -> list[float]:
        """[k] step_cost(k) for k = 0 .. max_draft_tokens, in one pass."""
        declined, at_zero = self.decline_rate(), self.cost_curve(0)
        costs = []
        for k, verified in enumerate(self.tokens_verified_up_to(max_draft_tokens)):
            verify = curve_at(self.cost_curve, verified)
            if k:
                verify = (1.0 - declined) * verify + declined * at_zero
            costs.append(verify + self.step_overhead(k))
        return costs

    def step_overhead(self, num_drafted: int) -> float:
        """What a step drafting `num_drafted` costs beyond its verify forward, in one-token decodes: what a plain step
        costs beyond it (learned from plain steps), plus for k > 0 what a drafting step costs beyond that, per step
        (the drafter and the verifier run once whatever k) and per token (learned from drafting steps). Fitted on
        every step as one line, the per-step cost a run of one-token drafts paid was charged to plain decoding too, so
        k = 1 looked cheap: random Medusa heads, greedy, on SmolLM2 at ~1.25 decodes a step were asked 6-9 times per
        128-token call before their estimate fell below k = 1's. While nothing is drafted, the drafting
        steps' evidence ages (`stale_decay` per plain step) back to the priors (no cost beyond a plain step's but
        the drafter's stated per-token cost), so a cost learned once, or wrongly, is tried again, as the one line
        forgot it."""
        plain = self.plain_overhead.predict(0)
        return plain + self.overhead.predict(num_drafted) if num_drafted else plain

    def choose(self) -> int:
        tokens = self.expected_tokens_up_to(self.max_draft_tokens)
        costs = self.step_costs_up_to(self.max_draft_tokens)
        rates = [expected / cost for expected, cost in zip(tokens, costs)]
        k = max(range(len(rates)), key=rates.__getitem__)
        if rates[k] < (1.0 + self.min_gain) * rates[0]:  # a gain within the estimates' error: decode plainly
            k = 0
        # a probe costs a plain step and drafting one token: the budget pays for the drafting
        self._last_asked = self.probes.after(k, probe_cost=self.overhead.predict(1))
        return self._last_asked

    def observe(self, num_drafted: int, num_accepted: int, seconds: float | None = None,
                asked: int | None = None, verified: int | None = None) -> None:
        """The step drafted `num_drafted`, the verifier accepted `num_accepted`, and the step's engine work took
        `seconds` (None: not timed, learn acceptance only). `asked`: the k the step asked the drafter for, when not
        this policy's last choice (a batch's width chooses for every row). `verified`: the tokens the step verified,
        when not `num_drafted` (a tree `num_drafted` levels deep: its nodes)."""
        asked, self._last_asked = self._last_asked if asked is None else asked, 0
        if verified is not None and num_drafted:
            k = min(num_drafted, self.max_draft_tokens)
            self.verified_steps[k] = self.decay * self.verified_steps[k] + 1.0
            self.verified_sum[k] = self.decay * self.verified_sum[k] + verified
        self.probes.observed(num_accepted)
        if asked > 0:  # what asking gave: a draft, or none (declined)
            self.asked = self.decay * self.asked + 1.0
            self.declined = self.decay * self.declined + float(num_drafted == 0)
        for i in range(min(num_drafted, num_accepted + 1, self.max_draft_tokens)):  # reached: accepted ones + 1st miss
            self.tried[i] = self.decay * self.tried[i] + 1.0
            self.accepted[i] = self.decay * self.accepted[i] + float(i < num_accepted)
            self.prior_left[i] *= self.decay
        if num_drafted:  # positions past this step's draft were not tried: their evidence ages
            for i in range(min(num_drafted, self.max_draft_tokens), self.max_draft_tokens):
                self.tried[i] *= self.stale_decay
                self.accepted[i] *= self.stale_decay
        elif not asked:  # a plain step: every position's evidence and prior age alike (estimates kept, weight not)
            for i in range(self.max_draft_tokens):
                self.tried[i] *= self.stale_decay
                self.accepted[i] *= self.stale_decay
                self.prior_left[i] *= self.stale_decay
        decode_seconds = self.cost_curve.decode_seconds  # 0 until the curve knows this device's decode time
        if self.learn_step_cost and seconds is not None and decode_seconds > 0:
            ran = num_drafted or asked  # a declined ask still ran the drafter: its cost belongs to asking
            verify = self.cost_curve(self.verified_tokens(num_drafted) if verified is None else verified)
            step = clipped(seconds / decode_seconds, verify + self.step_overhead(ran))  # in one-token decodes
            self.observe_overhead(ran, step - verify)

    def observe_overhead(self, ran: int, residual: float) -> None:
        """Learn what a step cost beyond its verify forward (`residual`, one-token decodes) that ran the drafter for
        `ran` tokens (0: a plain step), as `step_overhead` prices it."""
        if ran:
            self.overhead.observe(ran, residual - self.plain_overhead.predict(0))
        else:
            self.plain_overhead.observe(0, residual)
            self.overhead.age(self.stale_decay)


class ProbeSchedule:
    """When to draft one token although drafting does not pay (a probe), so acceptance keeps being observed: after
    `every` steps at k=0. A probe that had nothing accepted (rejected, or declined by the drafter) doubles the wait,
    up to `max_every`; drafting on the evidence resets it. `accepted_resets` (one sequence's policy): an accepted
    probe resets it too, so a drafter that turns right is probed again soon and its estimates rise within a few steps
    (kept waits let one unlucky start hold drafting off for the rest of a generation); otherwise an accepted probe
    doubles the wait as well, so only drafting on the evidence brings it back (a batch's probes, which cost every row
    a token more, see `BatchDraftLength`). `odd_waits`: each doubling adds a step, so waits stay odd (from an odd
    `max_every`) and successive probes alternate between even and odd positions: the reference model repeating
    `_set_set_set...`, its Medusa heads right after `set` and unsure after `_`, was probed after `_` every time at
    even waits, and never drafted for again. `budget`: probes spend at most this many one-token decodes per step at
    k=0 (credit for `burst` probes at most, full at first), so a drafter whose probes are often accepted but whose
    drafting costs more than it saves is not probed every few steps; None: no limit."""

    def __init__(self, every: int = 2, max_every: int = 15, accepted_resets: bool = True, odd_waits: bool = True,
                 budget: float | None = None, burst: int = 2):
        self.every, self.max_every = every, max(every, max_every)
        self.accepted_resets, self.odd_waits = accepted_resets, odd_waits
        self.budget, self.burst = budget, burst
        self.credit: float | None = None  # one-token decodes probes may still spend (None: full, before the first step)
        self.wait = every  # steps at k=0 before the next probe
        self.steps_at_zero = 0
        self.probing = False  # the k just returned is a probe

    def after(self, k: int, may_probe: bool = True, probe_cost: float = 0.0) -> int:
        """The k chosen on the evidence -> the k to draft: 1 when it is 0 and a probe is due (and `may_probe`, and
        the budget has `probe_cost`, in one-token decodes, left)."""
        self.probing = False
        if k:
            self.steps_at_zero, self.wait = 0, self.every
            return k
        self.steps_at_zero += 1
        affordable = True
        if self.budget is not None:
            most = self.burst * probe_cost
            self.credit = most if self.credit is None else min(self.credit + self.budget, most)
            affordable = self.credit >= probe_cost
        if self.every and may_probe and affordable and self.steps_at_zero >= self.wait:
            self.steps_at_zero, self.probing = 0, True
            if self.budget is not None:
                self.credit -= probe_cost
            return 1
        return 0

    def observed(self, num_accepted: int) -> None:
        """The step's outcome: a probe that had nothing accepted doubles the wait; an accepted one resets it when
        `accepted_resets`, else doubles it too."""
        if self.probing:
            if num_accepted and self.accepted_resets:
                self.wait = self.every
            else:
                self.wait = min(2 * self.wait + int(self.odd_waits), self.max_every)
        self.probing = False


class StepOverhead:
    """What a step costs beyond its verify forward, as per_step + per_token * num_drafted (one-token decodes, >= 0).

    Decayed least squares over the steps seen; a ridge worth `ridge` steps pulls per_token towards `per_token` (the
    drafter's own estimate, 0 unless it gives one), so while the number drafted never varies the cost is read as
    per step (which does not favour any k) beyond what the drafter said a token costs. `step_ridge` (0: none) pulls
    per_step towards 0 the same way, so that evidence `age`d away leaves the fit at its priors.
    """

    def __init__(self, decay: float, ridge: float = 1.0, per_token: float = 0.0, step_ridge: float = 0.0):
        self.decay, self.ridge, self.prior_per_token, self.step_ridge = decay, ridge, per_token, step_ridge
        self.n = self.d = self.dd = self.r = self.dr = 0.0  # decayed sums of 1, d, d^2, r, d*r
        self.per_step, self.per_token = 0.0, per_token

    def predict(self, num_drafted: int) -> float:
        return self.per_step + num_drafted * self.per_token

    def observe(self, num_drafted: int, residual: float) -> None:
        d, g = float(num_drafted), self.decay
        self.n, self.d, self.dd = g * self.n + 1, g * self.d + d, g * self.dd + d * d
        self.r, self.dr = g * self.r + residual, g * self.dr + d * residual
        self._fit()

    def age(self, factor: float) -> None:
        """Weigh every step seen `factor` less, as if time had passed without such steps."""
        self.n, self.d, self.dd, self.r, self.dr = (factor * x for x in (self.n, self.d, self.dd, self.r, self.dr))
        self._fit()

    def _fit(self) -> None:
        # min over (s, t) of sum (r - s - t d)^2 + ridge (t - t0)^2 + step_ridge s^2, solved for t - t0 on residuals
        # net of t0 d.
        t0, n = self.prior_per_token, self.n + self.step_ridge
        if n <= 0:
            return
        r, dr, dd = self.r - t0 * self.d, self.dr - t0 * self.dd, self.dd + self.ridge
        det = n * dd - self.d * self.d
        per_step, per_token = (r * dd - self.d * dr) / det, t0 + (n * dr - self.d * r) / det
        if per_token < 0:
            per_step, per_token = self.r / n, 0.0
        if per_step < 0:
            per_step, per_token = 0.0, max(0.0, (self.dr + self.ridge * t0) / dd)
        self.per_step, self.per_token = max(0.0, per_step), per_token


def probe_in_shadow(policy, draft) -> bool:
    """Whether a step scores its draft in shadow (`verify_step.verify_in_shadow`) rather than verifying it: a chain of
    one token (a tree's siblings need the tree verifier) that the policy calls a probe to score so
    (`probe_in_shadow(full_forward)`; a policy without the method never probes)."""
    if draft.num_draft_tokens != 1 or draft.parents is not None:
        return False
    ask = getattr(policy, "probe_in_shadow", None)
    return ask is not None and ask(full_forward=draft.prefilled_layers == 0)


def probe_asked(policy, num_draft_tokens: int) -> bool:
    """Whether a step asking `num_draft_tokens` asks for a probe that a draft prefilling layers answers in shadow
    (`probe_in_shadow` of such a draft: always when the policy probes), so the drafter may skip prefilling the probe
    token (`DraftContext.probe`)."""
    ask = getattr(policy, "probe_in_shadow", None)
    return num_draft_tokens == 1 and ask is not None and ask(full_forward=False)


def capped_choice(policy, budget: int) -> int:
    """The k a step drafts: the policy's choice, at most `budget` (the drafts a step may still emit). With no budget
    the policy is not asked: it would read the empty draft that follows as the drafter declining."""
    return min(policy.choose(), budget) if budget > 0 else 0


def draft_length_policy(
    num_draft_tokens, load_cost_curve: Callable[[], CostCurve] | None = None, learn_step_cost: bool = True,
    draft_cost: float = 0.0, verified_tokens: Callable[[int], int] | None = None,
    max_draft_tokens: int = MAX_DRAFT_TOKENS,
):
    """An int -> a fixed policy; "auto" -> an adaptive one planning with `load_cost_curve()` (called only then, so
    a fixed k never reads the curve's cache) and learning step costs from timings unless told not to, starting from
    `draft_cost` decodes per draft token, pricing k drafts as `verified_tokens(k)` verified (default k), k up to
    `max_draft_tokens`; a ready policy object (choose/observe) is used as is."""
    if num_draft_tokens == "auto":
        if load_cost_curve is None:
            raise ValueError('num_draft_tokens="auto" needs the device\'s verify cost curve')
        return AdaptiveDraftLength(load_cost_curve(), learn_step_cost=learn_step_cost, draft_cost=draft_cost,
                                   verified_tokens=verified_tokens, max_draft_tokens=max_draft_tokens)
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        if hasattr(num_draft_tokens, "choose") and hasattr(num_draft_tokens, "observe"):
            return num_draft_tokens
        raise ValueError(
            f'num_draft_tokens must be an integer >= 0 (0 turns speculation off) or "auto", got {num_draft_tokens!r}'
        )
    return FixedDraftLength(num_draft_tokens)
