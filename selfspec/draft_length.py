"""How many tokens to draft each step. A policy sees only what the verifier accepted, never the tokens."""
from __future__ import annotations


class FixedDraftLength:
    """Always ask for the same number of draft tokens (the drafter may still propose fewer)."""

    def __init__(self, num_draft_tokens: int):
        self.num_draft_tokens = num_draft_tokens

    def choose(self) -> int:
        return self.num_draft_tokens

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass


def draft_length_policy(num_draft_tokens):
    """An int -> a fixed policy; a ready policy object (choose/observe) is used as is."""
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        if hasattr(num_draft_tokens, "choose") and hasattr(num_draft_tokens, "observe"):
            return num_draft_tokens
        raise ValueError(f"num_draft_tokens must be an integer >= 0 (0 turns speculation off), got {num_draft_tokens!r}")
    return FixedDraftLength(num_draft_tokens)
