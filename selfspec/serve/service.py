"""The served model through its life: loading (in a thread, while the HTTP server already answers 503), ready
(requests become jobs for the scheduler), closing (no new jobs; accepted ones finish or fail), or failed to load.

Knows the scheduler's interface and the request -> job step; nothing about HTTP.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from selfspec.serve.config import ServeConfig
from selfspec.serve.errors import APIError, unavailable
from selfspec.serve.prompts import PromptEncoder
from selfspec.serve.request_body import CompletionRequest
from selfspec.serve.scheduler import Job, Scheduler, Ticket

log = logging.getLogger("selfspec.serve")


class Service:
    def __init__(self, load: Callable[[], object], config: ServeConfig, metrics=None,
                 on_load_failure: Callable[[BaseException], None] | None = None):
        self.config = config
        self.metrics = metrics
        self.state = "loading"  # -> "ready" -> "closing" -> "closed"; or "failed"
        self.engine = None
        self._load = load
        self._on_load_failure = on_load_failure
        self._encoder: PromptEncoder | None = None
        self.scheduler: Scheduler | None = None  # once ready
        self._lock = threading.Lock()
        self._loader = threading.Thread(target=self._load_model, name="selfspec-serve-loader", daemon=True)
        self._closer: threading.Thread | None = None

    def start(self) -> None:
        self._loader.start()

    def _load_model(self) -> None:
        try:
            engine = self._load()
            encoder = PromptEncoder(engine.tokenizer, engine.target.vocab_size, engine.target.max_positions)
        except Exception as err:  # whatever loading raised: the server reports it and stops
            self.state = "failed"
            if self._on_load_failure is not None:  # (the command line reports it, as one line)
                self._on_load_failure(err)
            else:
                log.exception("loading the model failed")
            return
        with self._lock:
            if self.state != "loading":  # closed while loading: never start decoding
                return
            self.engine, self._encoder = engine, encoder
            self.scheduler = Scheduler(engine, self.config.max_queue, self.metrics, self.config.max_batch)
            self.state = "ready"
        log.info("model %s loaded; serving", self.config.model_name)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_name:
            raise APIError(404, f"the model {name!r} does not exist here; this server serves "
                           f"{self.config.model_name!r} (GET /v1/models)", param="model", code="model_not_found")

    def job(self, request: CompletionRequest) -> Job:
        """Encode a checked request's prompt and budget (400 when they do not fit) into a job."""
        encoded = self._ready()[0].encode(request)
        return Job(encoded.token_ids, encoded.max_tokens, request.sampling(), request.seed, request.stop,
                   self.config.num_draft_tokens)

    def submit(self, job: Job, on_event: Callable[[object], None]) -> Ticket:
        return self._ready()[1].submit(job, on_event)

    def _ready(self) -> tuple[PromptEncoder, Scheduler]:
        if self.state == "loading":
            raise unavailable("the model is still loading; retry shortly", code="loading", retry_after_s=5)
        if self.state == "failed":
            raise unavailable("the model failed to load", code="load_failed")
        if self.state != "ready":
            raise unavailable("the server is shutting down", code="shutting_down")
        return self._encoder, self.scheduler

    def begin_close(self) -> None:
        """Start closing in the background (the HTTP server keeps answering the accepted requests meanwhile)."""
        with self._lock:
            if self._closer is not None:
                return
            self._closer = threading.Thread(target=self._close, name="selfspec-serve-closer", daemon=True)
            self._closer.start()

    def close(self) -> None:
        """Close and wait until every accepted request has finished or failed."""
        self.begin_close()
        self._closer.join()

    def _close(self) -> None:
        with self._lock:
            if self.state in ("loading", "ready"):
                self.state = "closing"
            scheduler = self.scheduler
        if scheduler is not None:
            scheduler.close(self.config.shutdown_grace_s)
        if self.state == "closing":
            self.state = "closed"
