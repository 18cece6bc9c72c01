"""A batch that rows join and leave between steps (continuous batching: what `selfspec serve` runs). Each row is a
prompt with its own budget, sampling settings, seed and stop strings; the rows share the batch's draft length. A
joining row's prompt is prefilled in a forward of its own, then the row steps with the others (`decode.py`'s step,
`RaggedCache.join`); a row that finishes, or that the caller ends, leaves. Each row decodes as if alone
(`decode.py`), so greedy and seeded rows give `generate`'s tokens for the same prompt and arguments. Knows the
batch's rows; nothing about requests, threads or HTTP.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from selfspec.batch.decode import (_batch_planner, _check_batch_support, _decode_batch, _new_row, _row_drafters,
                                   _StepClock)
from selfspec.inputs import check_lengths
from selfspec.sampling import SamplingConfig
from selfspec.seeded import keyed_noise
from selfspec.stats import GenerationStats


@dataclass(frozen=True)
class RowRequest:
    index: int  # the caller's name for the row (unique among the rows decoding)
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int | None = None  # sampling with a seed: the row's draws keyed by it, as `generate(seed=...)` alone
    stop_strings: tuple[str, ...] = ()
    sampling: SamplingConfig | None = None  # the row's own settings (None: the batch's)


@dataclass(frozen=True)
class RowFinished:
    index: int
    stats: GenerationStats | None  # the row's own stats, as `generate` reports them (None: refused)
    error: ValueError | None = None  # why the row was refused before it decoded (a prompt past the context, ...)


class JoiningBatch:
    """Rows of one draft length, each with its own sampling settings. `steps(first, admit)` decodes `first`, calls
    `admit()` before every step for more rows, and yields per target forward (emitted [(index, tokens)], finished
    [RowFinished]) until no row is left; `end(index)` stops a row between steps (it is not reported as finished). A
    request the batch cannot take (a prompt past the context) is reported finished with its error, and the others
    decode. sampling: the rows' settings where a request names none."""

    def __init__(self, spec, sampling: SamplingConfig = SamplingConfig(), num_draft_tokens: int | str = "auto"):
        from selfspec.engine import DecodeOptions

        self.spec = spec
        self.options = DecodeOptions(1, sampling, num_draft_tokens)  # (each row's budget and seed are its own)
        _check_batch_support(spec, self.options)
        self._rows = {}  # index -> the row, while it decodes

    def end(self, index: int) -> None:
        """Stop row `index` before the next step; its tokens so far stand."""
        row = self._rows.pop(index, None)
        if row is not None:
            row.stop.done = True

    def steps(self, first: list[RowRequest], admit: Callable[[], list[RowRequest]]
              ) -> Iterator[tuple[list[tuple[int, list[int]]], list[RowFinished]]]:
        spec, target = self.spec, self.spec.target
        drafters, batch_drafter = _row_drafters(spec.drafter, target, len(first))
        clock = _StepClock(spec.clock)

        drafter = batch_drafter if batch_drafter is not None else drafters[0]  # (every row's: `_row_drafters`)

        refused = []  # (a request the batch cannot take fails alone; the others decode)

        def rows_for(requests: list[RowRequest]) -> list:
            rows = []
            for request in requests:
                try:
                    rows.append(self._row(request, drafter, clock))
                except ValueError as err:
                    refused.append(RowFinished(request.index, None, err))
            self._rows.update((row.index, row) for row in rows)
            return rows

        total = GenerationStats(drafter_parameter_bytes=spec.drafter_bytes())
        initial = rows_for(first)
        if not initial:
            yield [], refused
            return
        pieces = _decode_batch(target, initial, clock, total, _batch_planner(spec, self.options), batch_drafter,
                               admit=lambda: rows_for(admit()))
        for emitted in spec.engine_steps(pieces):
            finished = [RowFinished(index, row.recorder.stats) for index, row in self._rows.items() if row.stop.done]
            for done in finished:
                del self._rows[done.index]
            yield emitted, refused + finished
            refused.clear()
        if refused:  # (refused while joining the last step)
            yield [], list(refused)

    def _row(self, request: RowRequest, drafter, clock):
        target = self.spec.target
        prompt = torch.as_tensor(request.prompt_ids, dtype=torch.long, device=target.device)
        if prompt.dim() != 1 or not prompt.numel():
            raise ValueError(f"row {request.index}: expected a non-empty list of token ids")
        check_lengths(prompt.shape[0], request.max_new_tokens, target.max_positions)
        options = replace(self.options, max_new_tokens=request.max_new_tokens, seed=request.seed,
                          stop_strings=list(request.stop_strings) or None,
                          sampling=request.sampling or self.options.sampling)
        noise = keyed_noise(request.seed, None, target.vocab_size, target.device)  # (greedy: never read)
        return _new_row(self.spec, request.index, prompt, options, drafter, noise, clock)
