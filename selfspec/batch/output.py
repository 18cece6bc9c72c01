"""What several prompts decoded together give back: `BatchGenerateOutput` (generate), `BatchTokenStream` (stream) and
the batch's total stats. A thin layer over the batched loop's pieces (`batch.py`); knows the tokenizer, never the
model, cache or drafts.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from selfspec.stats import GenerationStats
from selfspec.streaming import TextDecoder


@dataclass
class BatchGenerateOutput:
    """sequences[i]: [T_i + new_i] prompt i followed by its new tokens (rows differ in length, so a list, in input
    order). stats: the whole batch (target_forwards counts batched forwards; seconds are the batch's wall time on the
    engine; tokens, drafts and acceptance summed over rows). row_stats[i]: row i alone: the forwards it took part in,
    the seconds of the steps it waited for (its latency), its drafts, its share of the cache."""

    sequences: list[torch.Tensor]
    stats: GenerationStats
    row_stats: list[GenerationStats]
    text: list[str] | None = None  # each completion, when a tokenizer is known


@dataclass(frozen=True)
class RowPiece:
    row: int  # index of the prompt in the input list
    token_ids: list[int]  # ids this row committed in one target forward (empty for a final flush of held-back text)
    text: str | None  # newly stable text of this row ("" while held back); None when no tokenizer is known


class BatchTokenStream:
    """What `stream` returns for several prompts: iterate for `RowPiece`s, one per row that committed tokens in each
    target forward (rows in input order within a forward), then each row's held-back text. `stats` and `row_stats`
    are final once the iteration ends; `token_ids[i]` and `text[i]` are row i's completion so far."""

    def __init__(self, prompt_ids: list[torch.Tensor], steps: Iterator, stats: GenerationStats,
                 row_stats: list[GenerationStats], tokenizer=None):
        self.prompt_ids = prompt_ids
        self.stats = stats
        self.row_stats = row_stats
        self.token_ids: list[list[int]] = [[] for _ in prompt_ids]
        self._steps = steps
        self._decoders = [TextDecoder(tokenizer) for _ in prompt_ids] if tokenizer is not None else None

    @property
    def text(self) -> list[str] | None:
        return [d.text for d in self._decoders] if self._decoders is not None else None

    def __iter__(self) -> Iterator[RowPiece]:
        for step in self._steps:
            for row, tokens in sorted(step):
                self.token_ids[row] += tokens
                yield RowPiece(row, tokens, self._decoders[row].push(tokens) if self._decoders is not None else None)
        for row, decoder in enumerate(self._decoders or ()):
            rest = decoder.flush()
            if rest:
                yield RowPiece(row, [], rest)


def total_stats(total: GenerationStats, rows: list[GenerationStats], target_forwards: int, prefill_seconds: float,
                decode_seconds: float, peak_cache_bytes: int) -> None:
    """Fill the batch's total (its one writer, called once when the batch ends): counts summed over rows; forwards,
    seconds and cache peak of the batch itself, so tokens_per_second is the batch's throughput."""
    total.new_tokens = sum(s.new_tokens for s in rows)
    total.drafted = sum(s.drafted for s in rows)
    total.accepted = sum(s.accepted for s in rows)
    total.probed = sum(s.probed for s in rows)
    total.probes_accepted = sum(s.probes_accepted for s in rows)
    width = max((len(s.drafted_by_position) for s in rows), default=0)
    total.drafted_by_position = [sum(s.drafted_by_position[i] for s in rows if i < len(s.drafted_by_position))
                                 for i in range(width)]
    total.accepted_by_position = [sum(s.accepted_by_position[i] for s in rows if i < len(s.accepted_by_position))
                                  for i in range(width)]
    total.target_forwards = target_forwards
    total.prefill_seconds, total.decode_seconds = prefill_seconds, decode_seconds
    total.peak_cache_bytes = peak_cache_bytes
