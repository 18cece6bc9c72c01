"""The server's settings: one frozen dataclass whose fields the command line's flags map onto one to one."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"  # loopback: reachable from this machine only, until the operator says otherwise
API_KEY_ENV = "SELFSPEC_API_KEY"


@dataclass(frozen=True)
class ServeConfig:
    model_name: str  # what /v1/models lists and requests must name (OpenAI's "model" field)
    host: str = DEFAULT_HOST
    port: int = 8000
    # None: no authentication (fine on the loopback default); else every /v1 request needs `Authorization: Bearer KEY`
    api_key: str | None = None
    # Requests waiting behind the one decoding; more get 429. 16: on a CPU a 128-token answer of a small model takes
    # seconds, so a longer queue only turns a quick 429 into a client's timeout.
    max_queue: int = 16
    # Largest request body; more gets 413. 1 MiB holds a prompt of ~250k tokens, past any supported context window.
    max_body_bytes: int = 1 << 20
    # Seconds a shutdown lets accepted requests finish before failing the rest with 503 (none is left hanging).
    shutdown_grace_s: float = 30.0
    # Draft tokens per step for every request: "auto" (the engine's default) or an int (0: speculation off).
    num_draft_tokens: int | str = "auto"
    # Requests decoded together in one continuous batch (those agreeing on their sampling settings); 1: one at a time.
    max_batch: int = 8

    def __post_init__(self):
        if not self.model_name:
            raise ValueError("model_name must be a non-empty name")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
