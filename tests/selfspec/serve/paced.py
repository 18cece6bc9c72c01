"""A SelfSpecModel stand-in for server tests that need time to act: the real engine's streams, each held at a gate
before its first step and slowed by a delay per step (the tokens are the engine's own)."""
from __future__ import annotations

import threading
import time


class PacedEngine:
    def __init__(self, engine, delay: float = 0.0, gate: threading.Event | None = None):
        self.engine = engine
        self.model, self.tokenizer, self.target = engine.model, engine.tokenizer, engine.target
        self.delay = delay
        self.gate = gate

    def stream(self, *args, **kwargs):
        return PacedStream(self.engine.stream(*args, **kwargs), self.delay, self.gate)

    def engine_steps(self, pieces):
        """A batch's steps (the server's continuous batches run through this), paced as `stream`'s pieces."""
        return iter(PacedStream(self.engine.engine_steps(pieces), self.delay, self.gate))

    def __getattr__(self, name):  # (everything else a batch reads of the engine: the engine's own)
        return getattr(self.engine, name)


class PacedStream:
    def __init__(self, stream, delay: float, gate):
        self.stream, self.delay, self.gate = stream, delay, gate

    @property
    def token_ids(self):
        return self.stream.token_ids

    @property
    def stats(self):
        return self.stream.stats

    def __iter__(self):
        if self.gate is not None:
            assert self.gate.wait(timeout=60), "the test never opened the gate"
        for piece in self.stream:
            time.sleep(self.delay)
            yield piece
