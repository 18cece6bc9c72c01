"""Sampling settings and the logits -> probabilities transforms, with `transformers`' `generate` semantics.

Knows nothing about models, caches or drafts: the verifier applies these same transforms to the draft and
to the target, so both sides are warped identically.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from selfspec.seeded import PositionNoise, add_noise

# transformers' `generate` casts logits to float32 before any processor. Our sampling math runs in float32, or
# wider when the model is wider (float64 test models), never narrower; greedy compares in float32 exactly as
# `generate` does, so argmax ties fall where `generate` puts them.
PROB_DTYPE = torch.float32


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. Greedy (`do_sample=False`) ignores the three warpers, as `generate` does."""

    do_sample: bool = False
    temperature: float = 1.0  # applied when != 1.0, first (TemperatureLogitsWarper)
    top_k: int | None = None  # None or 0 disables it; applied second (TopKLogitsWarper)
    top_p: float | None = None  # None or 1.0 disables it; applied third (TopPLogitsWarper)

    def __post_init__(self):
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {self.do_sample!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(
                f"temperature must be a finite number > 0, got {t!r}; for greedy decoding pass do_sample=False "
                "instead of temperature=0"
            )
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k must be None or an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.top_p is not None:
            p = self.top_p
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
                raise ValueError(f"top_p must be None or a number in (0, 1] (1.0 disables it), got {p!r}")

    @property
    def greedy(self) -> bool:
        return not self.do_sample


def warp_logits(logits: torch.Tensor, sampling: SamplingConfig, branch_free: bool = False) -> torch.Tensor:
    """Temperature, then top-k, then top-p, exactly as `generate(do_sample=True, ...)` chains them.

    logits: [..., vocab]; returns float32 (or wider) logits with removed tokens set to -inf. branch_free: top-p by
    tensor ops alone (no read of the scores on the host, no NumPy), for an accelerator or torch.compile; the same
    result, at the cost of a sort with indices for every row (`_top_p_removed`).
    """
    scores = logits.to(torch.promote_types(logits.dtype, PROB_DTYPE))
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if sampling.top_k:  # TopKLogitsWarper: keep every token scoring at least the k-th best (ties kept)
        k = min(sampling.top_k, scores.shape[-1])
        kth_best = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_best, -math.inf)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        scores = scores.masked_fill(_top_p_removed(scores, sampling.top_p, branch_free), -math.inf)
    return scores


def _top_p_removed(scores: torch.Tensor, top_p: float, branch_free: bool = False) -> torch.Tensor:
    """TopPLogitsWarper's mask: sort ascending, and drop the low tail whose cumulative softmax is <= 1 - top_p,
    always keeping the best token.

    Bit for bit the same decision, faster: the tail removed is a prefix of the ascending order, so it is every token
    scoring at most the last removed score, unless that score is tied with the first kept one (a tie straddling the
    boundary, where which of the tied tokens goes depends on the sort's order of equal values): then the sort with
    indices decides, as in `transformers`. The sorted values alone come from NumPy on a CPU (torch.sort of SmolLM2's
    49k scores costs ~5 ms on this project's CPU, a twelfth of a decode; NumPy's sort ~0.6 ms); the cumulative sums
    are computed by the same torch ops on the same values in the same order, hence identical.
    branch_free: every row takes the tie's rule (the sort with indices), which is the decision itself, so no read of
    the scores decides which way to go (the batched verdicts, `verdicts.py`)."""
    if branch_free:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        sorted_remove = _sorted_tail(sorted_scores, top_p)
        return sorted_remove.scatter(-1, order, sorted_remove)
    if scores.device.type == "cpu":
        import numpy as np

        sorted_scores = torch.from_numpy(np.sort(scores.detach().contiguous().numpy(), axis=-1))
    else:
        sorted_scores = torch.sort(scores, dim=-1).values
    sorted_remove = _sorted_tail(sorted_scores, top_p)
    num_removed = sorted_remove.sum(dim=-1, keepdim=True)  # [..., 1]; < vocab (the best token stays)
    last_removed = sorted_scores.gather(-1, (num_removed - 1).clamp(min=0))
    first_kept = sorted_scores.gather(-1, num_removed)
    if bool(((num_removed > 0) & (last_removed == first_kept)).any()):  # a tie straddles the boundary
        # torch.sort orders the same values, so sorted_remove stands; only its indices place the tied tokens.
        return sorted_remove.scatter(-1, torch.sort(scores, descending=False, dim=-1).indices, sorted_remove)
    return (scores <= last_removed) & (num_removed > 0)


def _sorted_tail(sorted_scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """[..., vocab] scores sorted ascending -> [..., vocab] whether each sorted place is in the removed tail."""
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    sorted_remove = cumulative <= (1 - top_p)
    sorted_remove[..., -1:] = False
    return sorted_remove


def logits_to_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """[..., vocab] logits -> [..., vocab] float32-or-wider probabilities under `sampling`.

    Greedy gives a one-hot at the float32 argmax (first index on ties, like `torch.argmax` in `generate`).
    """
    if sampling.greedy:
        probs = torch.zeros(logits.shape, dtype=torch.promote_types(logits.dtype, PROB_DTYPE), device=logits.device)
        return probs.scatter_(-1, greedy_tokens(logits).unsqueeze(-1), 1.0)
    return warp_logits(logits, sampling).softmax(dim=-1)


class WarpedRows:
    """[rows, vocab] logits whose rows become probabilities under `sampling` on first use: `rows[i]` equals
    `logits_to_probs(logits, sampling)[i]`, computed for row i alone.

    The sampled verifiers read rows up to the first rejection only, and warping one row costs a sort of the whole
    vocabulary under top-p (SmolLM2, 49k tokens: about 9 ms on this project's CPU, a sixth of a decode), so rows after
    a rejection are never warped. Indexable by row like a tensor, with its `dtype` and `device`."""

    def __init__(self, logits: torch.Tensor, sampling: SamplingConfig):
        self.logits, self.sampling = logits, sampling
        self.dtype = torch.promote_types(logits.dtype, PROB_DTYPE)
        self.device = logits.device
        self._rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.logits.shape[0]

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self._rows:
            self._rows[row] = logits_to_probs(self.logits[row], self.sampling)
        return self._rows[row]

    @property
    def num_warped(self) -> int:
        return len(self._rows)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] -> [...] argmax over the logits rounded to float32, exactly as `generate(do_sample=False)` picks
    (it casts to float32 first, so even a float64 model is compared in float32; ties go to the lowest id). On a CPU
    through `blocked_argmax` (the same ids, faster)."""
    scores = logits.to(torch.float32)
    if scores.device.type != "cpu" or scores.shape[-1] < 2 * ARGMAX_BLOCK:
        return scores.argmax(dim=-1)
    return blocked_argmax(scores)


# Elements per block of `blocked_argmax`: 128 was the fastest of 32 / 64 / 128 / 256 on an Intel Xeon with AVX-512 (one
# thread) over 1-24 rows of 8,192 and 49,152 logits, 64 within 10 % of it but at 11 rows of 49,152 (237 vs 146 us).
ARGMAX_BLOCK = 128


def blocked_argmax(scores: torch.Tensor, block: int = ARGMAX_BLOCK) -> torch.Tensor:
    """[..., n] -> [...] what `scores.argmax(dim=-1)` gives (the first index of the maximum; a NaN counts as the
    maximum there, and here), in two passes a CPU vectorises: every block's maximum (`amax`), then the first block
    holding the row's maximum and the first index of it inside that block (argmax over n / block and block
    elements). torch's CPU argmax reads ~2-3 ns an element on an Intel Xeon with AVX-512, amax ~0.2: verifying a tree
    of 10 on SmolLM2 (11 rows of 49,152 logits) took its argmax 1.2-1.5 ms, this 0.15 ms; 24 rows of the reference
    model's 8,192: 0.45 ms, 0.07 ms; one row of 49,152: 0.11 ms, 0.03 ms. A row length that is not a multiple of
    `block` is padded with -inf (never the first maximum: a -inf row's is its index 0)."""
    shape, n = scores.shape[:-1], scores.shape[-1]
    flat = scores.reshape(-1, n)
    if n % block:
        flat = torch.nn.functional.pad(flat, (0, block - n % block), value=-math.inf)
    blocks = flat.view(flat.shape[0], flat.shape[1] // block, block)  # [rows, n / block, block]
    first_block = blocks.amax(dim=-1).argmax(dim=-1)  # [rows] the first block holding the row's maximum
    rows = torch.arange(flat.shape[0], device=flat.device)
    return (first_block * block + blocks[rows, first_block].argmax(dim=-1)).reshape(shape)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """[..., vocab] probabilities (not necessarily normalised) -> [...] one sampled token id per row.

    Inverse CDF in float64: u ~ U[0, 1) from `generator` (one draw per row), the token is the first whose cumulative
    mass exceeds u times the total, so token i comes with probability p_i / sum(p) to within 2^-53, and a token of
    zero mass never (its cumulative equals its predecessor's). `torch.multinomial` does the same in float32 with
    more work around it: ~0.3 ms per row over 8k tokens and ~1.3 ms over SmolLM2's 49k on this project's CPU,
    against ~0.05 ms here (a sampled step draws two or three times)."""
    flat = probs.reshape(-1, probs.shape[-1])
    cumulative = flat.to(torch.float64).cumsum(dim=-1)  # [rows, vocab]
    total = cumulative[:, -1:]
    if not bool(((total > 0) & torch.isfinite(total)).all() and flat.amin() >= 0):
        raise ValueError("sample_from: every row needs finite, non-negative probabilities with a positive total "
                         f"(got totals {total.flatten().tolist()[:8]} and a smallest entry {float(flat.amin())})")
    u = torch.rand(flat.shape[0], 1, dtype=torch.float64, generator=generator, device=probs.device)
    tokens = torch.searchsorted(cumulative, u * total, right=True)  # [rows, 1]
    overshot = tokens >= flat.shape[-1]  # u * total rounded up to the total: the last token of positive mass
    if bool(overshot.any()):
        last_positive = flat.shape[-1] - 1 - (flat > 0).flip(-1).to(torch.int8).argmax(dim=-1, keepdim=True)
        tokens = torch.where(overshot, last_positive, tokens)
    return tokens.reshape(probs.shape[:-1])


def keyed_tokens(logits: torch.Tensor, sampling: SamplingConfig, noise: PositionNoise, positions,
                 vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[..., N] logits (over `vocab_ids`, or the whole vocabulary) -> [rows] each row's keyed draw at its position
    (`positions`: an int, or one per row), as ids into the logits' columns: argmax(warped logits + Gumbel noise)."""
    if positions is None:
        raise ValueError("a keyed draw (sampling with a seed) needs the sequence positions its tokens are for")
    rows = logits.reshape(-1, logits.shape[-1])
    return add_noise(warp_logits(rows, sampling), noise, positions, vocab_ids).argmax(dim=-1)


def keyed_scores(logits: torch.Tensor, sampling: SamplingConfig, noise: PositionNoise, positions,
                 vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, N] -> [rows, N] softmax of the warped logits plus each row's keyed noise: a drafter's confidence in each
    token being the keyed draw at that position (its argmax is `keyed_tokens`). Ranks a tree's children under a seed."""
    rows = logits.reshape(-1, logits.shape[-1])
    return add_noise(warp_logits(rows, sampling), noise, positions, vocab_ids).softmax(dim=-1)


def top_probability(logits: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """[..., vocab] -> [...] a draft's confidence: the top probability of `probs` (sampling), or of the plain softmax
    of `logits` when drawing was greedy (whose drafts are point masses, so they carry no probs)."""
    return (probs if probs is not None else logits.float().softmax(dim=-1)).amax(dim=-1)
