"""Streaming: committed tokens to stable text pieces, `SelfSpecModel.stream`'s iterator, and `transformers` streamers.

A thin layer over the decode loop's pieces, one per target forward: the prefill's first token is a piece of its own,
then each decode step's accepted drafts plus its recovered or bonus token. Knows the tokenizer, never the model, cache,
drafts or clock (the loop's `StatsRecorder` keeps consumer time out of the stats).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from selfspec.stats import GenerationStats

# Text that a later token may still change: an incomplete UTF-8 sequence decodes to U+FFFD until its last byte
# arrives, and a trailing space may be removed by `clean_up_tokenization_spaces` when punctuation follows.
_UNSTABLE_TAIL = "\ufffd "


class TextDecoder:
    """Committed token ids -> text pieces that later tokens cannot change; the pieces concatenate to exactly
    `tokenizer.decode(all_ids, skip_special_tokens=True)`, the `text` that `generate` returns.

    Holds back a trailing incomplete character (a partial multi-byte BPE piece) or space, as `TextStreamer` holds
    back unfinished text. Decodes the whole completion on each push: exact, and about 1 ms per thousand tokens
    of completion with a fast tokenizer on a slow CPU, which is small next to a forward of any real model.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""  # what was handed out so far

    def push(self, token_ids: list[int]) -> str:
        """Add committed ids; return the newly stable text (maybe empty)."""
        self.token_ids += token_ids
        full = self._decode()
        stable = full.rstrip(_UNSTABLE_TAIL)
        return self._hand_out(stable)

    def flush(self) -> str:
        """Generation ended: return whatever was held back."""
        return self._hand_out(self._decode())

    def _decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=self.skip_special_tokens)

    def _hand_out(self, stable: str) -> str:
        # `stable` extends what was handed out (held-back characters are the only ones that change); if a tokenizer
        # ever rewrote earlier text, the pieces would still never repeat or drop what was already handed out.
        piece = stable[len(self.text) :]
        self.text += piece
        return piece


@dataclass(frozen=True)
class StreamPiece:
    token_ids: list[int]  # ids committed by one target forward (empty for the final flush of held-back text)
    text: str | None  # newly stable text ("" while held back); None when no tokenizer is known


class TokenStream:
    """What `SelfSpecModel.stream` returns: iterate for `StreamPiece`s as tokens are accepted.

    During and after iteration: `token_ids` (the completion so far), `text` (its stable text, all of it at the end),
    `stats` (GenerationStats, final once the iteration ends), `prompt_ids` ([T] the prompt as encoded).
    """

    def __init__(self, prompt_ids: torch.Tensor, steps: Iterator[list[int]], stats: GenerationStats, tokenizer=None):
        self.prompt_ids = prompt_ids
        self.stats = stats
        self.token_ids: list[int] = []
        self._steps = steps
        self._decoder = TextDecoder(tokenizer) if tokenizer is not None else None

    @property
    def text(self) -> str | None:
        return self._decoder.text if self._decoder is not None else None

    def __iter__(self) -> Iterator[StreamPiece]:
        for tokens in self._steps:
            if tokens:
                self.token_ids += tokens
                yield StreamPiece(tokens, self._decoder.push(tokens) if self._decoder is not None else None)
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                yield StreamPiece([], rest)


def feed_streamer(prompt_ids: torch.Tensor, steps: Iterator[list[int]], streamer) -> Iterator[list[int]]:
    """Pass each step through, handing it to a `transformers` streamer as `generate` does: `put` the prompt
    ([1, T], on the CPU) first, then each step's new ids ([num_new]), then `end()` once generation is over."""
    if streamer is None:
        yield from steps
        return
    streamer.put(prompt_ids[None].cpu())
    for tokens in steps:
        if tokens:
            streamer.put(torch.tensor(tokens, dtype=torch.long))
        yield tokens
    streamer.end()
