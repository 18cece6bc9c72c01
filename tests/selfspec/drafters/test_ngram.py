"""The n-gram drafter, table-driven: the most recent earlier match of the longest suffix proposes what followed."""
import pytest
import torch

from selfspec.drafters.ngram import NgramDrafter, lookup

CASES = [
    # (history, num_draft_tokens, max_ngram, min_ngram, expected)
    ([1, 2, 3, 4, 1, 2], 2, 3, 1, [3, 4]),  # suffix [1, 2] matched at 0
    ([1, 2, 3, 9, 2, 5, 1, 2], 3, 3, 1, [3, 9, 2]),  # bigram [1, 2] beats the later unigram [2]
    ([1, 2, 7, 1, 2, 8, 1, 2], 1, 2, 1, [8]),  # most recent match wins
    ([5, 6, 7, 8], 3, 3, 1, []),  # no earlier occurrence of 8
    ([5, 6, 5], 4, 3, 1, [6, 5]),  # the continuation may run into the suffix itself
    ([4, 4, 4, 4], 2, 2, 1, [4]),  # overlapping matches: latest full match at 1 is followed by one token
    ([1, 2, 3, 1, 2], 0, 3, 1, []),  # asked for nothing
    ([3], 2, 3, 1, []),  # nothing before the suffix
    ([1, 2, 9, 2], 2, 3, 2, []),  # only a unigram matches and unigrams are not allowed
    ([1, 2, 3, 1, 2, 3], 5, 3, 3, [1, 2, 3]),  # trigram [1, 2, 3] at 0, then as much as the history has
]


@pytest.mark.parametrize("history, k, max_n, min_n, expected", CASES)
def test_lookup(history, k, max_n, min_n, expected):
    assert lookup(torch.tensor(history), k, max_n, min_n).tolist() == expected


def test_invalid_ngram_sizes():
    with pytest.raises(ValueError, match="min_ngram_size"):
        NgramDrafter(max_ngram_size=2, min_ngram_size=3)
    with pytest.raises(ValueError, match="min_ngram_size"):
        NgramDrafter(min_ngram_size=0)
