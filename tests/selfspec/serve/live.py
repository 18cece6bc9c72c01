"""A real server for tests: uvicorn in a thread on a free loopback port, serving a tiny model built in code (the
byte-level tokenizer of tests/selfspec/tiny_text.py, with its chat template, and the n-gram drafter)."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import replace

import httpx

from selfspec import SelfSpecModel
from selfspec.serve.config import ServeConfig
from selfspec.serve.server import build_server
from tests.selfspec.tiny_text import tiny_text_model, tiny_tokenizer

MODEL = "tiny"
# Drafts of 3 tokens every step: the speculative path runs whatever this machine's timings say ("auto" may choose 0).
CONFIG = ServeConfig(MODEL, num_draft_tokens=3, max_queue=8, shutdown_grace_s=5.0)


def tiny_engine(seed: int = 1) -> SelfSpecModel:
    return SelfSpecModel(tiny_text_model(seed=seed), drafter="ngram", tokenizer=tiny_tokenizer())


class LiveServer:
    """`with LiveServer(load) as server:` serves on server.url until the block ends (then shuts down, bounded)."""

    def __init__(self, load, config: ServeConfig = CONFIG, wait_ready: bool = True):
        self.load = load
        self.config = config
        self.wait_ready = wait_ready
        self.server = None
        self.thread = None

    def __enter__(self) -> LiveServer:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = build_server(self.load, replace(self.config, port=self.port), log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        if self.wait_ready:
            self.wait_for("ok")
        return self

    def wait_for(self, status: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while httpx.get(f"{self.url}/health", timeout=5).json().get("status") != status:
            assert time.monotonic() < deadline, f"the server never reported {status!r}"
            time.sleep(0.05)

    def stop(self, timeout: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the server did not shut down"

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(AssertionError):
            if self.thread.is_alive():
                self.stop()

    @property
    def metrics(self):
        return self.server.metrics
