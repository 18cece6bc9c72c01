"""Who decodes which request, and when: one worker thread takes accepted jobs from a bounded queue, in arrival
order, and runs each alone through `SelfSpecModel.stream`, so a request's tokens are exactly those `generate` returns
for the same prompt and arguments (greedy or seeded) whatever else the server is doing.

Limitation: requests run one at a time. A request that arrives while another decodes waits in the queue, so the
server's throughput is one request's, and the n-th waiting request waits for all those before it. The engine decodes
one prompt per `stream` call; its batched path (`selfspec/batch/`) decodes a fixed set of rows that cannot join or
leave mid-run. A continuous-batching scheduler (rows joining and leaving between steps) is to replace this class
behind the same interface: `submit(job, on_event) -> Ticket`, `Ticket.cancel()`, `close(grace_s)`, `depth`, `active`.

Knows the engine's `stream` and `Job`s of token ids; nothing about HTTP, JSON or text formats. Events go to each
job's `on_event` callback from the worker thread (the caller bridges them to its own event loop): `Piece`s, then
exactly one `Finished` or `Failed`.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from selfspec.serve.errors import APIError, internal, queue_full, unavailable

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
    def __init__(self, engine, max_queue: int, metrics=None):
        self.engine = engine
        self.max_queue = max_queue
        self.metrics = metrics
        self._eos_ids = _eos_ids(engine)
        self._cond = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        self._running: Ticket | None = None
        self._accepting = True
        self._thread = threading.Thread(target=self._work, name="selfspec-serve-worker", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the one decoding)."""
        return len(self._waiting)

    @property
    def active(self) -> int:
        """Jobs decoding now: 0 or 1 here (a batching scheduler: its rows)."""
        return int(self._running is not None)

    def submit(self, job: Job, on_event: Callable[[object], None]) -> Ticket:
        """Accept a job (raises APIError 503 once closing, 429 when the queue is full); `on_event` then gets its
        events from the worker thread."""
        ticket = Ticket(job, on_event, self._withdraw)
        with self._cond:
            if not self._accepting:
                raise unavailable("the server is shutting down", code="shutting_down")
            if len(self._waiting) + self.active > self.max_queue:
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
            waiting, running = list(self._waiting), self._running
        for ticket in waiting:
            ticket.cancel(reason)
        if running is not None:
            running.cancel(reason)  # the worker stops it after its current step
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

    def _next(self) -> Ticket | None:
        """The next job to decode (now marked running), or None once closed with nothing waiting."""
        with self._cond:
            while not self._waiting and self._accepting:
                self._cond.wait()
            self._running = self._waiting.popleft() if self._waiting else None
            self._gauges()
            return self._running

    def _work(self) -> None:
        while (ticket := self._next()) is not None:
            try:
                self._decode(ticket)
            except Exception as err:  # the worker outlives any one request's failure; that request gets the error
                log.exception("decoding a request failed")
                ticket.end(Failed(internal(f"decoding failed: {type(err).__name__}: {err}")))
            finally:
                with self._cond:
                    self._running = None
                    self._gauges()

    def _decode(self, ticket: Ticket) -> None:
        job = ticket.job
        stream = self.engine.stream(job.prompt_ids, **job.generate_kwargs())
        steps = 0
        for piece in stream:
            if ticket.cancelled.is_set():  # checked between steps: a cancelled request frees the worker at once
                ticket.end(Failed(ticket.cancel_reason or APIError(499, "cancelled", code="cancelled")))
                return
            if piece.token_ids and self.metrics is not None:
                self.metrics.step(len(piece.token_ids), first=steps == 0)
            steps += bool(piece.token_ids)
            ticket.send(Piece(list(piece.token_ids), piece.text or ""))
        tokens = stream.token_ids
        at_limit = len(tokens) >= job.max_new_tokens and not (tokens and tokens[-1] in self._eos_ids)
        if self.metrics is not None:
            self.metrics.finished(stream.stats, len(job.prompt_ids))
        ticket.end(Finished(len(job.prompt_ids), len(tokens), "length" if at_limit else "stop", stream.stats))

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.gauges(depth=len(self._waiting), active=self.active)


def _eos_ids(engine) -> frozenset[int]:
    """The ids that end generation by default (the model's generation config, as `SelfSpecModel.generate` reads it)."""
    eos = getattr(getattr(engine.model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([int(eos)] if isinstance(eos, int) else [int(t) for t in eos])
