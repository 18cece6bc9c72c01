"""When generation ends: EOS ids and `max_new_tokens`, honoured exactly even when one step commits many tokens."""
from __future__ import annotations

from collections.abc import Iterable


class StopCondition:
    def __init__(self, max_new_tokens: int, eos_token_ids: Iterable[int] = ()):
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.num_emitted = 0
        self.done = max_new_tokens == 0

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.num_emitted

    def admit(self, tokens: list[int]) -> list[int]:
        """Of the tokens one step committed, return those to emit: cut after the first EOS and at the budget."""
        kept = tokens[: self.remaining]
        for i, token in enumerate(kept):
            if token in self.eos_token_ids:
                kept = kept[: i + 1]
                self.done = True
                break
        self.num_emitted += len(kept)
        self.done = self.done or self.remaining <= 0
        return kept
