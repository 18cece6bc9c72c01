"""When generation ends: EOS ids, stop strings and `max_new_tokens`, honoured exactly even when one step commits
many tokens. Nothing after the token that ends generation is ever emitted.

Works on token ids; stop strings alone need the tokenizer (through `transformers`' own matcher). Knows nothing
about models, caches or drafts.
"""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import torch

from selfspec.inputs import holds_integers


class StopStrings:
    """Stop strings with the semantics of `transformers`' `generate(stop_strings=..., tokenizer=...)`, whose matcher
    (`StopStringCriteria`) this wraps: generation stops at the first token that completes a stop string, and that
    token is kept (so the text may run on past the stop string, to the end of that token). The match must end
    inside that newest token; it may begin in the prompt or in the middle of a token.

    prompt_ids: the prompt, whose tail a stop string may begin in (as it may in `generate`).
    """

    def __init__(self, stop_strings: str | Sequence[str], tokenizer, prompt_ids: Sequence[int] = ()):
        from transformers.generation.stopping_criteria import StopStringCriteria

        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        stop_strings = list(stop_strings)
        if tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer=... to SelfSpecModel or use from_pretrained")
        if not stop_strings or not all(isinstance(s, str) and s for s in stop_strings):
            raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
        self.stop_strings = tuple(stop_strings)
        self._criteria = StopStringCriteria(tokenizer, stop_strings)
        # A stop string of n characters spans at most n tokens, so the matcher reads the last n ids only.
        self._window = self._criteria.maximum_token_len
        self._pad_id = self._criteria.embedding_vec.shape[0] - 1  # the matcher's "matches nothing" row
        self._history = list(prompt_ids)[-self._window :]

    def first_match(self, tokens: Sequence[int]) -> int | None:
        """Index in `tokens` (the step's new ids, in order) of the first one that completes a stop string, or None.

        Remembers the tokens as the history later calls match across."""
        if not tokens:
            return None
        ids = [self._pad_id] * self._window + self._history + list(tokens)
        start = self._window + len(self._history)
        # [len(tokens), window]: row i holds the `window` ids that end with tokens[i], left-padded with no-match ids
        windows = torch.tensor([ids[start + i + 1 - self._window : start + i + 1] for i in range(len(tokens))])
        matched = self._criteria(windows, None).nonzero()
        self._history = ids[-self._window :]
        return int(matched[0, 0]) if matched.numel() else None


def eos_ids(eos_token_id, vocab_size: int) -> list[int]:
    """`eos_token_id` as `generate` takes it (one id or several: a list, a tuple or a 1-D tensor; Python, numpy or
    torch integers) -> the ids, each checked to be an id of the model's vocabulary [0, vocab_size)."""
    several = isinstance(eos_token_id, Iterable) and not isinstance(eos_token_id, str)
    several = several and getattr(eos_token_id, "ndim", 1) != 0  # (a 0-d tensor or array is one id)
    ids = []
    for value in list(eos_token_id) if several else [eos_token_id]:
        if isinstance(value, str):
            raise ValueError(f"eos_token_id={value!r} is a token's text: pass tokenizer.eos_token_id (an id), not the "
                             "token text (another token's id: tokenizer.convert_tokens_to_ids(text))")
        if not _is_token_id(value):
            got = f"{value!r} in {eos_token_id!r}" if several else repr(eos_token_id)
            raise ValueError(f"eos_token_id must be a token id (an int) or a list of them, got {got}")
        if not 0 <= int(value) < vocab_size:
            raise ValueError(f"eos_token_id {int(value)} is outside the model's vocabulary [0, {vocab_size}): pass an "
                             "id of this model's tokenizer (tokenizer.eos_token_id)")
        ids.append(int(value))
    return ids


def _is_token_id(value) -> bool:
    """A Python, numpy or 0-d torch integer; never a bool (an int to Python, but no one's token id)."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and holds_integers(value)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class StopCondition:
    def __init__(self, max_new_tokens: int, eos_token_ids: Iterable[int] = (), stop_strings: StopStrings | None = None):
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_strings = stop_strings
        self.num_emitted = 0
        self.done = max_new_tokens == 0

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.num_emitted

    def admit(self, tokens: list[int]) -> list[int]:
        """Of the tokens one step committed, return those to emit: cut at the budget, then after the first token
        that is an EOS id or completes a stop string."""
        kept = tokens[: self.remaining]
        last = self._first_stop(kept)
        if last is not None:
            kept = kept[: last + 1]
            self.done = True
        self.num_emitted += len(kept)
        self.done = self.done or self.remaining <= 0
        return kept

    def _first_stop(self, tokens: list[int]) -> int | None:
        """Index of the first token that ends generation (EOS or the end of a stop string), or None."""
        eos = next((i for i, token in enumerate(tokens) if token in self.eos_token_ids), None)
        if self.stop_strings is None:
            return eos
        # Tokens after an EOS are never emitted, so they need no matching (nor a place in the match history).
        string_end = self.stop_strings.first_match(tokens if eos is None else tokens[: eos + 1])
        return min((i for i in (eos, string_end) if i is not None), default=None)
