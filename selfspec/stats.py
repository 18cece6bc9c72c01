"""What one generation cost and how well its drafts did (`GenerationStats`, read by users and benchmarks), and the
one object that writes it (`StatsRecorder`, owned by the decode loop).

Knows counts, bytes and a clock; nothing about models, drafts' contents or who consumes the tokens.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    new_tokens: int = 0  # tokens returned after the prompt
    target_forwards: int = 0  # full-model forwards, prefill included
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the verifier kept
    # Probes scored in shadow (`verify_step.verify_in_shadow`): one-token drafts "auto" scored against plain
    # decoding's forward instead of verifying them; not in drafted / accepted (tokens verified).
    probed: int = 0
    probes_accepted: int = 0  # of those, how many the verifier would have accepted
    drafted_by_position: list[int] = field(default_factory=list)  # [i]: steps that proposed a draft token at position i
    accepted_by_position: list[int] = field(default_factory=list)  # [i]: of those, how many were accepted
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # bytes the drafter adds to the model: its parameters (heads, exit adapter, the LM head rows of a draft vocabulary)
    # and the bfloat16 or Q8_0 copies of their weights the few-row kernel streams (`draft_dtype`)
    drafter_parameter_bytes: int = 0
    peak_cache_bytes: int = 0  # largest storage of the KV cache tensors, taken after each step (KVCache.nbytes)

    @property
    def heads_bytes(self) -> int:
        """The older name of `drafter_parameter_bytes`."""
        return self.drafter_parameter_bytes

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per target forward: 1.0 for plain decoding, up to num_draft_tokens + 1 with perfect drafts."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """[i]: probability that draft position i is accepted, given that it was proposed."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        by_position = " ".join(f"{a:.2f}" for a in self.acceptance_by_position)
        return (
            f"{self.new_tokens} tokens in {self.seconds:.2f}s ({self.tokens_per_second:.1f} tok/s), "
            f"{self.tokens_per_forward:.2f} tokens per target forward, acceptance {self.acceptance_rate:.2f}"
            + (f" (by position: {by_position})" if by_position else "")
            + f", KV cache peak {_size(self.peak_cache_bytes)}"
            + (f", drafting heads/adapter {_size(self.drafter_parameter_bytes)}" if self.drafter_parameter_bytes else "")
        )


class StatsRecorder:
    """The only writer of one generation's `GenerationStats`, owned by the decode loop.

    Times the engine's own work only: the loop calls `start()` when it begins a piece of work (the prefill, or one
    decode step) and reports its end (`prefilled`, `stepped`) before it yields; whatever the consumer does between
    yields (printing, decoding text, a streamer's `put`) is never on the clock, so tokens/s measure the engine.
    `clock` returns seconds (default `time.perf_counter`); tests inject a scripted one.
    """

    def __init__(self, drafter_parameter_bytes: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.stats = GenerationStats(drafter_parameter_bytes=drafter_parameter_bytes)
        self.clock = clock
        self._started = 0.0

    def start(self) -> None:
        self._started = self.clock()

    def elapsed(self) -> float:
        """Seconds since `start()`."""
        return self.clock() - self._started

    def prefilled(self, num_emitted: int, cache_bytes: int) -> float:
        """The prefill forward (and the choice of the first token) ended; returns its seconds."""
        seconds = self.elapsed()
        self.stats.target_forwards += 1
        self.stats.prefill_seconds += seconds
        self._emitted(num_emitted, cache_bytes)
        return seconds

    def probed(self, accepted: bool) -> None:
        """The step scored a probe in shadow (before `stepped`, which records the step itself)."""
        self.stats.probed += 1
        self.stats.probes_accepted += int(accepted)

    def stepped(self, num_drafted: int, num_accepted: int, num_emitted: int, cache_bytes: int,
                num_positions: int | None = None) -> float:
        """One decode step (propose, verify, accept, roll back) ended; returns its seconds. num_positions: the draft
        positions the step could accept (a tree's depth; default num_drafted, a chain's length), which the
        per-position acceptance counts, while `drafted` counts every token verified."""
        seconds, stats = self.elapsed(), self.stats
        stats.target_forwards += 1
        stats.decode_seconds += seconds
        stats.drafted += num_drafted
        stats.accepted += num_accepted
        positions = num_drafted if num_positions is None else num_positions
        for counts in (stats.drafted_by_position, stats.accepted_by_position):
            counts.extend([0] * (positions - len(counts)))
        for i in range(positions):
            stats.drafted_by_position[i] += 1
            stats.accepted_by_position[i] += int(i < num_accepted)
        self._emitted(num_emitted, cache_bytes)
        return seconds

    def _emitted(self, num_emitted: int, cache_bytes: int) -> None:
        self.stats.new_tokens = num_emitted
        self.stats.peak_cache_bytes = max(self.stats.peak_cache_bytes, cache_bytes)


def _size(num_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"
