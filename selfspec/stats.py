"""What one generation cost and how well its drafts did; filled by the decode loop, read by users and benchmarks."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    new_tokens: int = 0  # tokens returned after the prompt
    target_forwards: int = 0  # full-model forwards, prefill included
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the verifier kept
    drafted_by_position: list[int] = field(default_factory=list)  # [i]: steps that proposed a draft token at position i
    accepted_by_position: list[int] = field(default_factory=list)  # [i]: of those, how many were accepted
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    heads_bytes: int = 0  # parameter bytes of the drafting heads (0 without heads)
    peak_cache_bytes: int = 0  # largest storage of the KV cache tensors, taken after each step (KVCache.nbytes)

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

    def record_step(self, num_drafted: int, num_accepted: int) -> None:
        self.target_forwards += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        for counts in (self.drafted_by_position, self.accepted_by_position):
            counts.extend([0] * (num_drafted - len(counts)))
        for i in range(num_drafted):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += int(i < num_accepted)

    def summary(self) -> str:
        by_position = " ".join(f"{a:.2f}" for a in self.acceptance_by_position)
        return (
            f"{self.new_tokens} tokens in {self.seconds:.2f}s ({self.tokens_per_second:.1f} tok/s), "
            f"{self.tokens_per_forward:.2f} tokens per target forward, acceptance {self.acceptance_rate:.2f}"
            + (f" (by position: {by_position})" if by_position else "")
            + f", KV cache peak {_size(self.peak_cache_bytes)}"
            + (f", heads {_size(self.heads_bytes)}" if self.heads_bytes else "")
        )


def _size(num_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"
