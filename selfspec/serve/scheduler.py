"""Who decodes which request, and when: one worker thread decodes the accepted jobs in continuous batches. It takes the
oldest waiting job and starts a batch with it (`selfspec/batch/joining.py`); before every step, waiting jobs join it,
oldest first, up to `max_batch` rows, each with its own sampling settings and seed (a batch has one draft length: a job
asking another waits at the head of the queue, nothing more joins, and it starts the next batch); finished or cancelled
rows leave after the step they end in (a batch of one decodes about as fast as `SelfSpecModel.stream`: SmolLM2, 64
tokens, one thread: 91-94 against 78-100 tokens/s). Every row decodes as if alone, so a request's tokens are exactly
those `generate` returns for the same prompt and arguments (greedy or seeded), whatever else the server is doing.
`max_batch=1` decodes one request at a time through `SelfSpecModel.stream`, as does an engine the batch cannot take
(tree drafts asked for explicitly, a drafter whose drafts share work).

Interface: `submit(job, on_event) -> Ticket`, `Ticket.cancel()`, `close(grace_s)`, `depth`, `active`. Knows the
engine's `stream`, `JoiningBatch` and `Job`s of token ids; nothing about HTTP, JSON or text formats. Events go to each
job's `on_event` callback from the worker thread (the caller bridges them to its own event loop): `Piece`s, then
exactly one `Finished` or `Failed`.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from selfspec.batch.joining import JoiningBatch, RowRequest
from selfspec.sampling import SamplingConfig
from selfspec.serve.errors import APIError, bad_request, internal, queue_full, unavailable
from selfspec.streaming import TextDecoder

log = logging.getLogger("selfspec.serve")


@dataclass(frozen=True)
class Job:
    """One request's decoding, as `SelfSpecModel.generate` / `stream` arguments."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: dict = field(default_factory=dict)  # do_sample, temperature, top_p, top_k
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    num_draft_tokens: int | str = "auto"

    def row_request(self, index: int) -> RowRequest:
        return RowRequest(index, list(self.prompt_ids), self.max_new_tokens, self.seed, tuple(self.stop_strings),
                          SamplingConfig(**self.sampling))

    def generate_kwargs(self) -> dict:
        """What `generate(self.prompt_ids, **kwargs)` (or `stream`) takes to decode this job."""
        return dict(max_new_tokens=self.max_new_tokens, seed=self.seed, num_draft_tokens=self.num_draft_tokens,
                    stop_strings=list(self.stop_strings) or None, **self.sampling)


@dataclass(frozen=True)
class Piece:
    token_ids: list[int]  # committed by one target forward (empty for the last piece of held-back text)
    text: str  # the newly stable text


@dataclass(frozen=True)
class Finished:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "length": the budget ran out; "stop": an EOS token or a stop string ended it
    stats: object  # selfspec.stats.GenerationStats


@dataclass(frozen=True)
class Failed:
    error: APIError


class Ticket:
    """An accepted job: cancel() withdraws it from the queue, or stops its decoding after the current step."""

    def __init__(self, job: Job, on_event: Callable[[object], None], withdraw: Callable[[Ticket], bool]):
        self.job = job
        self._on_event = on_event
        self._withdraw = withdraw
        self._lock = threading.Lock()
        self._ended = False
        self.cancel_reason: APIError | None = None  # why it was cancelled (None: the client went away)
        self.cancelled = threading.Event()

    def cancel(self, reason: APIError | None = None) -> None:
        self.cancel_reason = reason
        self.cancelled.set()
        if self._withdraw(self):  # it was still waiting: it ends here, the worker never sees it
            self.end(Failed(reason or APIError(499, "cancelled", code="cancelled")))

    def send(self, event) -> None:
        if not self._ended:
            self._deliver(event)

    def end(self, event) -> None:
        """Deliver the last event (Finished or Failed), once."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._deliver(event)

    def _deliver(self, event) -> None:
        try:
            self._on_event(event)
        except RuntimeError:  # the caller's event loop is gone (it stopped): no one is listening any more
            log.debug("dropped an event of a request whose listener has gone")


class Scheduler:
    def __init__(self, engine, max_queue: int, metrics=None, max_batch: int = 8):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine = engine
        self.max_queue = max_queue
        self.metrics = metrics
        self.max_batch = max_batch
        self._eos_ids = _eos_ids(engine)
        self._cond = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        self._running: dict[int, Ticket] = {}  # row index -> the job decoding in that row
        self._indices = itertools.count()
        self._accepting = True
        self._thread = threading.Thread(target=self._work, name="selfspec-serve-worker", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting those decoding)."""
        return len(self._waiting)

    @property
    def active(self) -> int:
        """Jobs decoding now (the batch's rows)."""
        return len(self._running)

    def submit(self, job: Job, on_event: Callable[[object], None]) -> Ticket:
        """Accept a job (raises APIError 503 once closing, 429 when the queue is full); `on_event` then gets its
        events from the worker thread."""
        ticket = Ticket(job, on_event, self._withdraw)
        with self._cond:
            if not self._accepting:
                raise unavailable("the server is shutting down", code="shutting_down")
            if len(self._waiting) - (self.max_batch - self.active) >= self.max_queue:  # (free rows take some now)
                raise queue_full(self.max_queue)
            self._waiting.append(ticket)
            self._gauges()
            self._cond.notify()
        return ticket

    def close(self, grace_s: float) -> None:
        """Stop accepting; let the accepted jobs finish for up to grace_s seconds, then fail those still waiting or
        decoding (503); return once the worker has stopped."""
        with self._cond:
            self._accepting = False
            self._cond.notify_all()
        self._thread.join(timeout=grace_s)
        if not self._thread.is_alive():
            return
        reason = unavailable("the server shut down before this request finished", code="shutting_down")
        with self._cond:
            waiting, running = list(self._waiting), list(self._running.values())
        for ticket in waiting + running:
            ticket.cancel(reason)  # (a decoding one: the worker stops it before its next step)
        self._thread.join(timeout=60)  # one step, or a long prompt's prefill
        if self._thread.is_alive():
            log.error("the decoding thread did not stop within 60 s of shutdown")

    def _withdraw(self, ticket: Ticket) -> bool:
        with self._cond:
            if ticket not in self._waiting:
                return False
            self._waiting.remove(ticket)
            self._gauges()
            return True

    def _next(self) -> tuple[int, Ticket] | None:
        """The oldest waiting job (now running) and its row index, or None once closed with nothing waiting."""
        with self._cond:
            while not self._waiting and self._accepting:
                self._cond.wait()
            if not self._waiting:
                return None
            return self._start(self._waiting.popleft())

    def _start(self, ticket: Ticket) -> tuple[int, Ticket]:
        index = next(self._indices)  # (under the lock)
        self._running[index] = ticket
        self._gauges()
        return index, ticket

    def _work(self) -> None:
        while (started := self._next()) is not None:
            try:
                if self.max_batch > 1:
                    self._decode_batch(*started)
                else:
                    self._decode(started[1])
            except Exception as err:  # the worker outlives any failure; the jobs it was decoding get the error
                log.exception("decoding failed")
                failure = Failed(internal(f"decoding failed: {type(err).__name__}: {err}"))
                for ticket in list(self._running.values()):
                    ticket.end(failure)
            finally:
                with self._cond:
                    self._running.clear()
                    self._gauges()

    def _decode(self, ticket: Ticket) -> None:
        """One job alone through the engine's `stream`."""
        job = ticket.job
        stream = self.engine.stream(job.prompt_ids, **job.generate_kwargs())
        steps = 0
        for piece in stream:
            if ticket.cancelled.is_set():  # checked between steps: a cancelled request frees the worker at once
                ticket.end(_cancelled(ticket))
                return
            if piece.token_ids and self.metrics is not None:
                self.metrics.step(len(piece.token_ids), first=steps == 0)
            steps += bool(piece.token_ids)
            ticket.send(Piece(list(piece.token_ids), piece.text or ""))
        self._finish(ticket, stream.token_ids, stream.stats)

    def _decode_batch(self, index: int, ticket: Ticket) -> None:
        """A continuous batch started by this job: waiting jobs of its draft length join before each step, oldest first
        (one of another draft length, at the head of the queue, stops joining: the batch drains and it goes next); rows
        leave as they end."""
        job = ticket.job
        try:  # (one draft length a batch; each row keeps its own sampling settings and seed)
            batch = JoiningBatch(self.engine, num_draft_tokens=job.num_draft_tokens)
        except NotImplementedError as err:  # an engine a batch cannot take: one job at a time from now on
            log.warning("decoding requests one at a time: %s", err)
            self.max_batch = 1
            self._decode(ticket)
            return
        rows = {index: _RowState(ticket, TextDecoder(self.engine.tokenizer))}

        def admit() -> list[RowRequest]:
            for row_index, state in list(rows.items()):  # cancelled rows leave between steps
                if state.ticket.cancelled.is_set():
                    batch.end(row_index)
                    del rows[row_index]
                    self._leave(row_index)
                    state.ticket.end(_cancelled(state.ticket))
            joining = []
            with self._cond:
                while (self._waiting and len(self._running) < self.max_batch
                       and self._waiting[0].job.num_draft_tokens == job.num_draft_tokens):
                    row_index, joined = self._start(self._waiting.popleft())
                    rows[row_index] = _RowState(joined, TextDecoder(self.engine.tokenizer))
                    joining.append(joined.job.row_request(row_index))
            return joining

        for emitted, finished in batch.steps([job.row_request(index)], admit):
            for row_index, tokens in emitted:
                state = rows.get(row_index)
                if state is None or not tokens:
                    continue
                if self.metrics is not None:
                    self.metrics.step(len(tokens), first=not state.token_ids)
                state.token_ids += tokens
                state.ticket.send(Piece(list(tokens), state.decoder.push(tokens)))
            for done in finished:
                state = rows.pop(done.index, None)
                if state is None:
                    continue
                self._leave(done.index)
                if done.error is not None:  # (refused alone; the batch goes on)
                    state.ticket.end(Failed(bad_request(str(done.error))))
                    continue
                rest = state.decoder.flush()
                if rest:
                    state.ticket.send(Piece([], rest))
                self._finish(state.ticket, state.token_ids, done.stats)

    def _leave(self, index: int) -> None:
        with self._cond:
            self._running.pop(index, None)
            self._gauges()

    def _finish(self, ticket: Ticket, tokens: list[int], stats) -> None:
        job = ticket.job
        at_limit = len(tokens) >= job.max_new_tokens and not (tokens and tokens[-1] in self._eos_ids)
        if self.metrics is not None:
            self.metrics.finished(stats, len(job.prompt_ids))
        ticket.end(Finished(len(job.prompt_ids), len(tokens), "length" if at_limit else "stop", stats))

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.gauges(depth=len(self._waiting), active=self.active)


@dataclass
class _RowState:
    ticket: Ticket
    decoder: TextDecoder
    token_ids: list[int] = field(default_factory=list)


def _cancelled(ticket: Ticket) -> Failed:
    return Failed(ticket.cancel_reason or APIError(499, "cancelled", code="cancelled"))


def _eos_ids(engine) -> frozenset[int]:
    """The ids that end generation by default (the model's generation config, as `SelfSpecModel.generate` reads it)."""
    eos = getattr(getattr(engine.model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([int(eos)] if isinstance(eos, int) else [int(t) for t in eos])
