"""The server's Prometheus metrics, in a registry of their own (two servers in one process never share counts).

Knows counts and the engine's `GenerationStats`; written by the scheduler (queue, rows, steps) and the routes
(requests by status), read by GET /metrics.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
DRAFT_BUCKETS = tuple(range(0, 17))  # accepted draft tokens per step: 0 .. 16 ("auto" plans at most 8)
TOKENS_PER_FORWARD_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("selfspec_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.queue_depth = Gauge("selfspec_queue_depth", "requests waiting for the decoding thread", registry=r)
        self.active_rows = Gauge("selfspec_active_rows", "requests decoding now (one at most in this server)",
                                 registry=r)
        self.generated_tokens = Counter("selfspec_generated_tokens", "tokens generated (completion tokens)",
                                        registry=r)
        self.prompt_tokens = Counter("selfspec_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.target_forwards = Counter("selfspec_target_forwards", "full-model forwards (prefills included)",
                                       registry=r)
        self.tokens_per_forward = Histogram("selfspec_tokens_per_forward",
                                            "new tokens per target forward, one sample per finished request",
                                            buckets=TOKENS_PER_FORWARD_BUCKETS, registry=r)
        self.accepted_draft_length = Histogram("selfspec_accepted_draft_length",
                                               "draft tokens the verifier accepted, one sample per decode step",
                                               buckets=DRAFT_BUCKETS, registry=r)

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def gauges(self, depth: int, active: int) -> None:
        self.queue_depth.set(depth)
        self.active_rows.set(active)

    def step(self, num_tokens: int, first: bool) -> None:
        """One target forward committed num_tokens; after the prefill (first), accepted drafts + one token."""
        self.generated_tokens.inc(num_tokens)
        self.target_forwards.inc()
        if not first:
            self.accepted_draft_length.observe(num_tokens - 1)

    def finished(self, stats, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        if stats.target_forwards:
            self.tokens_per_forward.observe(stats.tokens_per_forward)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
