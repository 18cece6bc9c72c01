"""Prompt-lookup drafting: the most recent earlier occurrence of the context's last n tokens proposes what followed.

Zero parameters, point-mass drafts. Tries the longest n-gram first (`max_ngram_size` down to `min_ngram_size`).
"""
from __future__ import annotations

import torch

from selfspec.drafters.base import Draft, DraftContext, check_count


class NgramDrafter:
    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1):
        check_count("max_ngram_size", max_ngram_size)
        check_count("min_ngram_size", min_ngram_size)
        if not 1 <= min_ngram_size <= max_ngram_size:
            raise ValueError(
                f"need 1 <= min_ngram_size <= max_ngram_size, got {min_ngram_size} and {max_ngram_size}"
            )
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size

    def propose(self, context: DraftContext) -> Draft:
        tokens = lookup(context.token_ids, context.num_draft_tokens, self.max_ngram_size, self.min_ngram_size)
        return Draft(tokens)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass


def lookup(token_ids: torch.Tensor, num_draft_tokens: int, max_ngram_size: int, min_ngram_size: int = 1) -> torch.Tensor:
    """[num_tokens] -> up to [num_draft_tokens] tokens that followed the latest earlier match of the suffix."""
    num_tokens = token_ids.shape[0]
    if num_draft_tokens > 0:
        for n in range(min(max_ngram_size, num_tokens - 1), min_ngram_size - 1, -1):
            suffix = token_ids[num_tokens - n :]
            # Windows starting at 0 .. num_tokens-n-1: every earlier occurrence followed by at least one token.
            windows = token_ids[: num_tokens - 1].unfold(0, n, 1)  # [num_tokens - n, n]
            starts = (windows == suffix).all(dim=1).nonzero()
            if starts.numel():
                follow = int(starts[-1, 0]) + n
                return token_ids[follow : follow + num_draft_tokens].clone()
    return token_ids.new_empty(0)
