"""What verifying k draft tokens costs on this device, relative to decoding one token: the curve (`VerifyCost`), a
conservative prior, an explicit measurement, a curve that refines itself from the verify forwards the engine runs
anyway (`LearnedVerifyCost`), and where it is kept between processes.

Knows the target model only as something to time and to name (the cache key); knows nothing about drafters,
acceptance, or the policy that plans with the curve (`draft_length.py`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from selfspec.attention_backends import attention_route
from selfspec.cache_dir import cache_dir

# Environment variable naming the directory for selfspec's cached curves; default $XDG_CACHE_HOME/selfspec, else
# ~/.cache/selfspec (the usual place for data that can be rebuilt at any time).
MAX_DRAFT_TOKENS = 8  # one sequence's curve is kept for k = 0 .. 8 and extrapolated linearly beyond
# A timed step is learned from as at most this many times what it was predicted to cost: one stalled step (the OS, a
# GPU's first forward of a new shape, which the engine also leaves untimed) otherwise teaches "auto" that drafting is
# dear for many steps after (tests/selfspec/draft_length/test_policy.py). A cost that really is higher is still learned:
# each step can raise the estimate 3x, so a few steps reach it.
OUTLIER_RATIO = 3.0
# Timed forwards of one draft size after which its cost counts as known (`LearnedVerifyCost.knows`); the count kept is
# capped (MAX_TIMED) so a kept file stays small and old evidence does not read as more than it is.
KNOWN_AFTER, MAX_TIMED = 2, 100
# A price a previous process kept for some k is evidence worth at most this many of this process's timings of that k
# (`LearnedVerifyCost.remember`): it was timed under another load of the machine, and it ages like any residual.
KEPT_EVIDENCE = 4.0
# A batch's curve is indexed by the padded forward's tokens - 1 (B * (1 + w) - 1): it is kept that far, enough for
# batch 16 at width 8 (143) with room; beyond it the fit extrapolates.
BATCH_CURVE_SIZE = 256


def clipped(observed: float, predicted: float) -> float:
    """An observed cost as a learner should take it: at most OUTLIER_RATIO x the prediction (when there is one)."""
    return min(observed, OUTLIER_RATIO * predicted) if predicted > 0 else observed


@dataclass(frozen=True)
class VerifyCost:
    """relative[k]: seconds of one target forward over k + 1 new tokens (verifying k drafts) divided by the seconds
    of a one-token decode (relative[0] == 1). About 1 + 0.15 k on a 2-core CPU, about 1 on a large GPU."""

    relative: tuple[float, ...]
    decode_seconds: float = 0.0  # the one-token decode the ratios are relative to (0 when not measured)
    timed: tuple[int, ...] = ()  # [k] timed forwards behind relative[k] (kept curves; () when unknown)

    def __call__(self, num_draft_tokens: int) -> float:
        last = len(self.relative) - 1
        if num_draft_tokens <= last:
            return self.relative[num_draft_tokens]
        slope = self.relative[last] - self.relative[last - 1] if last else 0.0
        return self.relative[last] + slope * (num_draft_tokens - last)  # linear beyond what was measured


def prior_verify_cost(device: torch.device) -> VerifyCost:
    """The curve assumed before anything is known about this model on this device: 1 + jump * sqrt(k).

    Concave, as every measured curve is (the first extra token costs most; FACTS.md, SmolLM2-135M on one thread:
    k=2 1.61, 4 1.54, 8 1.76, 16 2.20; the reference model: k=1 1.26-1.57, 3 1.46-1.74, 8 1.73-1.99), and above all
    of those measurements on a CPU (jump 0.4: 1.40 at k=1, 1.69 at k=3, 2.13 at k=8), so drafts must earn their
    keep before they are drafted and a useless drafter starts near plain decoding's speed, while good drafts still
    reach long chains. On an accelerator 0.1 (a large GPU stays near 1 up to dozens of tokens).
    """
    jump = 0.4 if device.type == "cpu" else 0.1
    return VerifyCost(tuple(1.0 + jump * math.sqrt(k) for k in range(MAX_DRAFT_TOKENS + 1)))


class LearnedVerifyCost:
    """A verify-cost curve that refines itself from timed verify forwards: seconds(k) ~ a + b * (start(k) - 1).

    `start` is the curve it began from (cached on disk, or the prior); `a` is this device's one-token decode and
    `b / a` rescales the start curve's extra cost per verified token. Both are fitted by decayed least squares; a
    ridge holds b / a at 1 (the start curve) with the weight of `prior_weight` observations, so while every step
    verifies the same number of tokens the shape stays the start's and only the scale is learned.
    Called like a `VerifyCost`; `snapshot()` freezes it, `save()` keeps it for the next process.

    A CPU's cost is not smooth in k: measured on SmolLM2 (one thread) verifying 1 / 2 / 3 / 4 drafts cost
    1.10 / 1.18 / 1.64 / 1.73 decodes (the matrix kernel changes at 4 rows), which no rescaled smooth curve holds: the
    fit said 1.09 at k = 3, and "auto" drafting 3 ran at 0.76x of a fixed k = 2. So each k also keeps what its own
    forwards cost beyond the fit (a decayed mean, `residual_decay` per observation of that k, shrunk towards 0 with the
    weight of `residual_prior` observations); the curve is fit plus residual, relative to the same at k = 0 (so
    `decode_seconds` is the decode as measured, not the fit's intercept), and it is saved so, so the next process
    starts from the measured shape.

    A k that is not timed for a while is priced more and more by the fit: each timing of another k ages the residual
    evidence of every other k by `stale_decay`. Without it a price that a slow spell had raised could stay raised for
    good once "auto" stopped drafting that many tokens, as it was then never timed again (once SmolLM2's tree
    curve on two threads, timed while another process ran on the second core, priced 8 nodes at 3.16 decodes where
    they cost ~1.3-1.6, and that run's default tree drafted ~3 nodes a step at 1.58 tokens per forward where a fixed
    tree of 10 gave 2.40; trees time such counts again by chance, a chain's k only when asked for).

    Defaults: decay 0.98 remembers about 50 steps (the cost drifts slowly as the context grows, while single steps
    are noisy); stale_decay 0.97 halves an untimed k's evidence in about 23 timings of others (a choice, not
    measured). The ridge's weight 0.1 is a tenth of one step's evidence at one prior unit of extra cost: enough to
    fix the shape when k never varies, small next to the spread that varied k's give (50 steps over k = 0 .. 8 weigh
    about 5), so those teach the slope with a bias of about 2 % (tests/selfspec/draft_length/test_verify_cost.py).
    """

    def __init__(self, start: VerifyCost, path: Path | None = None, decay: float = 0.98, prior_weight: float = 0.1,
                 residual_decay: float = 0.9, residual_prior: float = 0.5, size: int = MAX_DRAFT_TOKENS + 1,
                 non_decreasing: bool = True, stale_decay: float = 0.97):
        self.start, self.path, self.size = start, path, size  # size: k = 0 .. size - 1 keep their own residuals
        self.non_decreasing = non_decreasing  # see __call__; a batch's curve is not (`learned_batch_verify_cost`)
        self.decay, self.prior_weight = decay, prior_weight
        self.residual_decay, self.residual_prior = residual_decay, residual_prior
        self.stale_decay = stale_decay  # per timing of another k, for each k's residual evidence (1: never ages)
        # [k] decayed sums of (observed - fit) in seconds, and of their count, k < size. Seconds, not units of the fit's
        # intercept: the intercept can move far (a batch's line through totals 7 .. 23 put it near 0), and
        # old residuals in its old units then read as many times what they were.
        self._residual = [0.0] * size
        self._residual_weight = [0.0] * size
        self._held: dict[int, float] = {}  # k -> its price kept by an earlier process, until timed here (`hold`)
        self._intercept = start.decode_seconds  # the fit's a
        self.sums = [0.0] * 5  # decayed sums of 1, m, m^2, t, m * t, where m = start(k) - 1 and t = seconds
        self.decode_seconds = start.decode_seconds  # the decode as measured (fit + k = 0 residual); 0 until timed
        self.scale = 1.0  # b / a
        self.num_observed = 0
        # [k] timed forwards that verified k drafts, here and in the processes that kept the start curve
        self.timed = [start.timed[k] if k < len(start.timed) else 0 for k in range(size)]
        self._refresh()

    def __call__(self, num_draft_tokens: int) -> float:
        """Non-decreasing in k (verifying more never costs less; residuals of noisy steps could say otherwise), unless
        built with non_decreasing=False (a batch's curve: `learned_batch_verify_cost`)."""
        if self.non_decreasing and 0 <= num_draft_tokens < self.size:
            return self._relative[num_draft_tokens]
        raw = self._raw(num_draft_tokens)
        return max(1.0, (max(raw, self._highest_raw) if self.non_decreasing else raw) / self._raw_decode)

    def knows(self, num_draft_tokens: int) -> bool:
        """Whether the cost of verifying this many drafts was timed (KNOWN_AFTER forwards, in this process or in those
        that kept the curve), not only extrapolated from the start curve's shape. "auto" verifies its probes for real
        until the cost of one draft is known, so that a pessimistic prior is corrected by measurement."""
        return 0 <= num_draft_tokens < self.size and self.timed[num_draft_tokens] >= KNOWN_AFTER

    def was_timed(self, num_draft_tokens: int) -> bool:
        """Whether any forward verifying this many drafts was timed (here or by the processes that kept the curve);
        a batch's planner trusts a width once its total was (`BatchDraftLength`)."""
        return 0 <= num_draft_tokens < self.size and self.timed[num_draft_tokens] > 0

    def fit(self, num_draft_tokens: int) -> float:
        """The smooth part, in units of the fit's intercept: the start curve, rescaled."""
        return 1.0 + self.scale * (self.start(num_draft_tokens) - 1.0)

    def residual(self, num_draft_tokens: int) -> float:
        """What forwards verifying this many drafts cost beyond the fit, in units of its intercept (0 beyond the
        curve's range, and while unobserved)."""
        if not 0 <= num_draft_tokens < self.size:
            return 0.0
        weight = self._residual_weight[num_draft_tokens] + self.residual_prior
        return self._residual[num_draft_tokens] / weight / self._intercept if self._intercept > 0 else 0.0

    def _raw(self, num_draft_tokens: int) -> float:
        held = self._held.get(num_draft_tokens)
        if held is not None:  # (k > 0: k = 0 is what the held prices are relative to)
            return held * self._raw(0)
        return max(1e-3, self.fit(num_draft_tokens) + self.residual(num_draft_tokens))

    def _refresh(self) -> None:
        """Recompute the curve at k < size after the fit or a residual changed (the policy reads it several times a
        step; it changes only here). A curve that is not kept non-decreasing (a batch's: 256 entries, of which a step
        reads about ten) is priced when read instead: recomputing it all cost ~0.4 ms a step (3 % of the reference
        model's batch-8 step in a profile)."""
        if not self.non_decreasing:
            self._raw_decode, self._relative = self._raw(0), None
            return
        raw = [self._raw(k) for k in range(self.size)]
        self._raw_decode, highest, relative = raw[0], 0.0, []
        for value in raw:
            highest = max(highest, value)
            relative.append(max(1.0, highest / raw[0]))
        self._highest_raw, self._relative = highest, tuple(relative)

    @property
    def relative(self) -> tuple[float, ...]:
        if self._relative is None:  # (priced when read: see _refresh)
            self._relative = tuple(self(k) for k in range(self.size))
        return self._relative

    def observe(self, num_draft_tokens: int, seconds: float) -> None:
        """One full target forward that verified `num_draft_tokens` drafts took `seconds` (clipped to OUTLIER_RATIO x
        what the curve predicted, once it knows this device's decode time)."""
        seconds = clipped(seconds, self.decode_seconds * self(num_draft_tokens))
        m, g = self.start(num_draft_tokens) - 1.0, self.decay
        for i, value in enumerate((1.0, m, m * m, seconds, m * seconds)):
            self.sums[i] = g * self.sums[i] + value
        self.num_observed += 1
        if 0 <= num_draft_tokens < self.size:
            self.timed[num_draft_tokens] = min(self.timed[num_draft_tokens] + 1, MAX_TIMED)
        n, sm, smm, st, smt = self.sums
        w = self.prior_weight
        # Normal equations of sum (t - a - b m)^2 + w (b - a)^2 over (a, b).
        a11, a12, a22 = n + w, sm - w, smm + w
        det = a11 * a22 - a12 * a12
        if det <= 1e-12 * a11 * a22:
            return
        a = (st * a22 - a12 * smt) / det
        b = (a11 * smt - a12 * st) / det
        if a > 0:
            self._intercept, self.scale = a, max(0.0, b / a)  # verifying more never costs less
        k = num_draft_tokens
        if 0 <= k < self.size and self._intercept > 0:
            self._held.pop(k, None)  # the first timing here replaces what an earlier process kept
            if self.stale_decay < 1.0:  # every other k's evidence ages (this k's is decayed next, as observed)
                for other in range(self.size):
                    if other != k:
                        self._residual[other] *= self.stale_decay
                        self._residual_weight[other] *= self.stale_decay
            g = self.residual_decay
            self._residual[k] = g * self._residual[k] + seconds - self._intercept * self.fit(k)
            self._residual_weight[k] = g * self._residual_weight[k] + 1.0
        self._refresh()
        if self._intercept > 0:
            self.decode_seconds = self._intercept * self._raw_decode

    def hold(self, prices: dict[int, float]) -> None:
        """Prices an earlier process measured (k > 0 -> cost relative to k = 0): each prices its k as it was kept,
        whatever the fit learns meanwhile, until this process times that k; its first timing replaces the kept price
        rather than averaging with it. A kept price may come from another load, other contexts or other batch shapes
        (once a batch curve kept 16 forward tokens at 3.35 one-row decodes, from an earlier batch of 16 rows;
        8 rows of two measure ~1.6 now); averaged, one such price outlasts several timings."""
        self._held.update({k: price for k, price in prices.items() if 0 < k < self.size})
        self._refresh()

    def remember(self, prices: dict[int, float], counts) -> None:
        """Prices an earlier process kept (k > 0 -> cost relative to k = 0), each taken as residual evidence worth
        min(counts[k], KEPT_EVIDENCE) timings of its k: the curve prices each k as kept, this process's timings average
        with it, and it ages while its k goes untimed (`stale_decay`), towards the fit."""
        if self._intercept <= 0:
            return  # (a kept curve with no decode time: nothing to price seconds with)
        for k, price in prices.items():
            if 0 < k < self.size and k < len(counts) and counts[k] > 0:
                weight = min(float(counts[k]), KEPT_EVIDENCE)
                residual = (price * self._raw(0) - self.fit(k)) * self._intercept  # seconds over the fit
                self._residual[k] = residual * (weight + self.residual_prior)  # (residual() divides it back)
                self._residual_weight[k] = weight
        self._refresh()

    def snapshot(self) -> VerifyCost:
        return VerifyCost(self.relative, self.decode_seconds, tuple(self.timed))

    def save(self) -> None:
        """Keep the curve for later processes (nothing to keep before a step was timed, or without a path)."""
        if self.path is None or not self.num_observed:
            return
        _write_json(self.path, {"relative": list(self.relative), "decode_seconds": self.decode_seconds,
                                "timed": self.timed})


def learned_verify_cost(target, tree: bool = False, few_row_kernel: bool | str = False,
                        max_tokens: int = MAX_DRAFT_TOKENS) -> LearnedVerifyCost:
    """This model's curve on this device: the one a previous process kept, else the prior; refined from here on.
    tree: the curve of tree verify forwards (a custom 4D mask, a slower attention path), kept apart from chains'.
    few_row_kernel: the forwards' few-row products run through selfspec/kernel/few_row_linear.py (cheaper: a curve apart);
    "one row": one-row products too (`FewRowLinears.one_row`), another curve again. max_tokens: the most tokens a
    step verifies (a tree's node budget), each count up to it priced by its own timings, not extrapolated.
    A kept curve is split as a batch's is (`_line_and_kept`): the line through its timed prices is what the fit
    rescales, and each timed price is remembered as aged evidence (`LearnedVerifyCost.remember`)."""
    path = cache_dir() / "verify_cost" / f"{cost_key(target, tree, few_row_kernel)}.json"
    start = _read_curve(path) or prior_verify_cost(target.device)
    line, prices = _line_and_kept(start)  # (the prior timed nothing: it is its own line, with no prices to remember)
    curve = LearnedVerifyCost(line, path, size=max(max_tokens, MAX_DRAFT_TOKENS) + 1)
    curve.remember(prices, start.timed)
    return curve


def kept_one_row(target, measure: Callable[[], bool]) -> bool:
    """Whether plain decoding's one-row products go through the few-row kernel (`FewRowLinears.route_one_row`): the
    answer a previous process kept for this model, device, dtype, threads and kernel (`cost_key`), else `measure()`
    (`FewRowLinears.one_row_pays`: a fraction of a second), kept for the next. Once per machine and model, so no
    call pays it twice, and a fresh process's first call does not."""
    path = cache_dir() / "one_row" / f"{cost_key(target, few_row_kernel=True)}.json"
    try:
        kept = json.loads(path.read_text())["one_row"]
        if isinstance(kept, bool):
            return kept
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or from another version: measure
    one_row = bool(measure())
    _write_json(path, {"one_row": one_row})
    return one_row


def learned_batch_verify_cost(target, single: VerifyCost, few_row_kernel: bool | str = False) -> LearnedVerifyCost:
    """The curve batches plan with: k = the padded forward's tokens - 1 (B * (1 + w) - 1) -> its cost in one-row
    decodes. The one a previous process kept, else a straight line through `single` (this model's one-sequence
    curve, see `straight`); refined from every batch's timed forwards, shared by the batches of one wrapper and kept
    on disk after each, apart from one sequence's curve (a batched forward is shaped unlike one sequence's: each row
    attends over its own cache). Each total keeps what its own forwards cost (a CPU's cost jumps where a product
    leaves the few-row kernel at 32 rows), and a weak pull towards the start's slope (a hundredth of a step at one unit
    of extra cost; a choice, not measured) lets the widths a batch explores show its own shape. Not kept
    non-decreasing: a batch times only totals B * (1 + w) - 1, and between two it timed the fit may lie above the
    later one (a cheap 15 after an unmeasured 14 priced by a line through 7 .. 23), which a running maximum would
    carry over it."""
    path = cache_dir() / "verify_cost" / f"{cost_key(target, few_row_kernel=few_row_kernel, batch=True)}.json"
    return batch_cost_curve(_read_curve(path) or straight(single), path)


def batch_cost_curve(start: VerifyCost, path: Path | None = None) -> LearnedVerifyCost:
    """A batch's curve (see `learned_batch_verify_cost`) from `start`, kept at `path` (None: never saved).

    A start that timed some totals (a kept batch curve) is split in two: the line through 1 at k = 0 that fits its
    timed totals best (weighted by how often each was timed) is what the fit rescales, and each timed total keeps its
    kept price (`LearnedVerifyCost.hold`) until this process times it, whose first timing replaces it. Taken whole as
    the start, a kept curve's kinks were the fit's own shape: one total kept far too high (once 16 forward
    tokens at 3.35 one-row decodes on SmolLM2, timed by an earlier batch of 16 rows; 8 rows of two measure ~1.6 and
    16 of one ~1.3-1.6 now) bent the fit everywhere else when it was timed again (32 tokens' price fell 37 % against 8's
    in tests/selfspec/draft_length/test_verify_cost.py, though neither had changed)."""
    line, kept = _line_and_kept(start)
    curve = LearnedVerifyCost(line, path, prior_weight=0.01, size=BATCH_CURVE_SIZE, non_decreasing=False,
                              stale_decay=1.0)
    curve.hold(kept)
    return curve


def _line_and_kept(curve: VerifyCost) -> tuple[VerifyCost, dict[int, float]]:
    """(the line 1 + slope * k fitted by least squares to the curve's timed k > 0, weighted by their counts, with
    its decode and counts; {timed k > 0: the curve's price there}); a curve that timed no k > 0 (a line to start
    from, `straight`) is its own line."""
    timed = [(k, n) for k, n in enumerate(curve.timed) if 0 < k < len(curve.relative) and n > 0]
    if not timed:
        return curve, {}
    slope = sum(n * k * (curve.relative[k] - 1.0) for k, n in timed) / sum(n * k * k for k, n in timed)
    line = VerifyCost(tuple(1.0 + max(0.0, slope) * k for k in range(len(curve.relative))), curve.decode_seconds,
                      curve.timed)
    return line, {k: curve.relative[k] for k, _ in timed}


def straight(curve: VerifyCost) -> VerifyCost:
    """The line through 1 at k = 0 and the curve's last measured point. A batch's forwards are all past the concave
    start of one sequence's curve (B rows are B - 1 drafts' worth at w = 0), where a fit of a + b * (curve(k) - 1)
    on a concave curve extended linearly would put the intercept `a` (the decode it rescales) below zero."""
    last = len(curve.relative) - 1
    slope = (curve.relative[last] - 1.0) / last if last else 0.0
    return VerifyCost(tuple(1.0 + slope * k for k in range(last + 1)), curve.decode_seconds)


def cost_key(target, tree: bool = False, few_row_kernel: bool | str = False, batch: bool = False) -> str:
    """What the curve depends on: the architecture and size (not the weights' values), device, dtype, threads, the
    engine's attention path there, whether the forwards verify trees or batches and whether their few-row products
    run through selfspec's kernel."""
    model, device = target.model, target.device
    weight = target.lm_head.weight
    described = {
        "model": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": target.num_layers,
        "hidden": target.hidden_size,
        "vocab": target.vocab_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "dtype": str(weight.dtype),
        "threads": torch.get_num_threads(),
        "attention": attention_route(device),  # (masked blocks are cheaper on CPU since grouped heads are read in place)
    }
    if tree:
        described["tree"] = True
    if few_row_kernel:  # (its version: a faster kernel makes a kept curve stale)
        from selfspec.kernel.few_row_linear import kernel_version

        described["few_row_kernel"] = kernel_version()
        if few_row_kernel == "one row":  # plain decoding's products through it too: another unit of cost
            described["one_row"] = True
    if batch:
        described["batch"] = True
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]


def _read_curve(path: Path) -> VerifyCost | None:
    try:
        raw = json.loads(path.read_text())
        relative = tuple(float(c) for c in raw["relative"])
        decode_seconds = float(raw["decode_seconds"])
        timed = tuple(int(n) for n in raw.get("timed", ()))  # (curves kept without it: none known)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or from another version: start over
    if len(relative) < 2 or relative[0] != 1.0 or any(c < 1.0 for c in relative):
        return None
    return VerifyCost(relative, decode_seconds, timed)


def _write_json(path: Path, content: dict) -> None:
    """Atomically (a concurrent reader sees the old file or the new one); a cache that cannot be written (read-only
    home, full disk) only costs the next process its head start, so it is skipped silently."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(content))
        os.replace(partial, path)
    except OSError:
        pass


@torch.inference_mode()
def measure_verify_cost(target, max_draft_tokens: int = 8, context_length: int = 128, repeats: int = 7) -> VerifyCost:
    """Time target forwards of 1 .. max_draft_tokens + 1 tokens after a `context_length`-token cache (a few dozen
    forwards: for benchmarks and tools; decoding itself learns the curve from its own steps instead).

    Sizes are interleaved within each round; each size keeps its fastest of `repeats` rounds (other processes only
    ever add time, so the minimum is the least disturbed), and the ratios are made non-decreasing by pooling
    neighbours that violate it (verifying more never costs less; pooling, unlike a running max, lets no single
    slow outlier raise every larger size).
    """
    if target.max_positions is not None:
        context_length = max(1, min(context_length, target.max_positions - max_draft_tokens - 1))
    cache = target.new_cache()
    ids = torch.arange(context_length + max_draft_tokens + 1, device=target.device) % target.vocab_size
    target.forward(ids[:context_length], cache)
    fastest = [float("inf")] * (max_draft_tokens + 1)
    for repeat in range(repeats + 1):  # the first pass warms up
        for k in range(max_draft_tokens + 1):
            _sync(target.device)
            started = time.perf_counter()
            target.logits(target.forward(ids[context_length : context_length + k + 1], cache))
            _sync(target.device)
            if repeat:
                fastest[k] = min(fastest[k], time.perf_counter() - started)
            cache.rollback(context_length)
    relative = _non_decreasing([max(1.0, f / fastest[0]) for f in fastest])
    return VerifyCost(tuple([1.0] + relative[1:]), fastest[0])


def _non_decreasing(values: list[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(n)]


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
