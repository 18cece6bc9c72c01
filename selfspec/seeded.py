"""Seeded sampling keyed by position: every random draw that decides the token at sequence position n is a function
of (seed, n) alone, never of how many draws came before.

The token at position n is argmax(warped target logits + G_n), G_n i.i.d. standard Gumbel noise over the vocabulary
generated from (seed, n) by a counter-keyed stream (Gumbel-max: exactly a sample of softmax(warped logits), the
target's law). Drafts for position n are drawn with the same G_n over the draft's own warped logits, and the
verifier accepts a draft token exactly when it equals the target's draw there (a tree: follows the child equal to
it). So with a seed the tokens are those plain seeded sampling (`drafter="none"`) gives, whatever the drafter, the
number of draft tokens, the tree, the batch or the timings: the output is plain sampling's, for every run.

Knows nothing about models, caches or drafters: noise in, tokens out. Chosen over rejection sampling with a
generator consumed in order (whose tokens depend on how many drafts each step verified) so that "auto" may plan
the draft length from timings while a seed still fixes the tokens.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

_MASK64 = (1 << 64) - 1
NOISE_DTYPE = torch.float64  # the Gumbel noise and the sum it is added into: ties between tokens stay ~2^-50 rare


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that scatters neighbouring keys."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class PositionNoise:
    """Standard Gumbel noise per sequence position, keyed by (seed, position): `gumbel(n)` is the same [vocab]
    tensor however often and in whatever order positions are asked for. Keeps the last few positions' noise (a step
    drafts and verifies the same positions)."""

    def __init__(self, seed: int, vocab_size: int, device, keep: int = 64):
        self.seed, self.vocab_size, self.device = int(seed), vocab_size, torch.device(device)
        self._seed_key = _mix64(self.seed & _MASK64)
        self._kept: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._keep = keep

    @classmethod
    def from_generator(cls, generator: torch.Generator, vocab_size: int, device) -> "PositionNoise":
        """A user's torch.Generator gives one 63-bit seed per call (its state advances once per call, not per draw)."""
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device))
        return cls(seed, vocab_size, device)

    def gumbel(self, position: int) -> torch.Tensor:
        """[vocab] float64 Gumbel(0, 1) noise deciding the token at sequence position `position`."""
        noise = self._kept.get(position)
        if noise is None:
            stream = torch.Generator(device=self.device).manual_seed(_mix64(self._seed_key ^ position))
            uniform = torch.rand(self.vocab_size, generator=stream, device=self.device, dtype=NOISE_DTYPE)
            # u in [tiny, 1): -log(-log(u)) is finite; u = 0 would give -inf (a token that could never be drawn)
            noise = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(NOISE_DTYPE).tiny)))
            self._kept[position] = noise
            if len(self._kept) > self._keep:
                self._kept.popitem(last=False)
        return noise

    def rows(self, positions: Sequence[int], vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[len(positions), vocab or N] the noise of each row's position (restricted to `vocab_ids` when given)."""
        noise = torch.stack([self.gumbel(int(p)) for p in positions])
        return noise if vocab_ids is None else noise[:, vocab_ids]


def _positions(positions: int | Sequence[int], num_rows: int) -> list[int]:
    """One position per row: an int for every row alike, or a sequence with one per row."""
    if isinstance(positions, int):
        return [positions] * num_rows
    positions = [int(p) for p in positions]
    if len(positions) != num_rows:
        raise ValueError(f"{len(positions)} positions for {num_rows} rows of logits")
    return positions


def add_noise(warped: torch.Tensor, noise: PositionNoise, positions: int | Sequence[int],
              vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, N] warped logits (`sampling.warp_logits`: removed tokens -inf) over `vocab_ids`, or the whole vocabulary
    -> [rows, N] float64 warped logits + each row's position's Gumbel noise. The argmax is the token drawn at that
    position (softmax(warped) is the law, restricted to `vocab_ids` for a draft vocabulary)."""
    rows = warped.reshape(-1, warped.shape[-1])
    gumbel = noise.rows(_positions(positions, rows.shape[0]), vocab_ids)  # [rows, N]
    return rows.to(NOISE_DTYPE) + gumbel


def keyed_noise(seed: int | None, generator: torch.Generator | None, vocab_size: int, device) -> PositionNoise | None:
    """What a call's `seed` / `generator` mean: the keyed noise of that seed (or of one seed drawn from the
    generator); None without either (sampling then draws from torch's global generator, by rejection sampling)."""
    if seed is not None:
        return PositionNoise(seed, vocab_size, device)
    if generator is not None:
        return PositionNoise.from_generator(generator, vocab_size, device)
    return None
