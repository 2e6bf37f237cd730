"""Prometheus metrics of one server (`GET /metrics`), in a registry of its own.

Counters and histograms are what dashboards aggregate across replicas: E/T over any window is
`rate(llm_ensembling_ensembled_tokens_total)` over
`rate(llm_ensembling_completion_tokens_total)`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from core.config import Stats

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RATE = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    def __init__(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        prefix = "llm_ensembling_"
        r = self.registry
        self.requests = Counter(
            prefix + "requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            prefix + "request_seconds", "whole request time", ["endpoint"], buckets=_LATENCY,
            registry=r,
        )  # fmt: skip
        self.first_token = Histogram(
            prefix + "time_to_first_token_seconds", "time to the first streamed text",
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(prefix + "prompt_tokens", "prompt tokens", registry=r)
        self.completion_tokens = Counter(prefix + "completion_tokens", "output tokens", registry=r)
        self.ensembled = Counter(
            prefix + "ensembled_tokens", "output tokens an ensemble decision chose", registry=r
        )
        self.ensemble_rate = Histogram(
            prefix + "ensemble_rate", "E/T of each finished request", buckets=_RATE, registry=r
        )
        self.member_failures = Counter(
            prefix + "member_failures", "members that failed in a request", ["member"], registry=r
        )
        self.cancelled = Counter(
            prefix + "cancelled_requests", "requests whose client left before the end", registry=r
        )
        running_gauge = Gauge(prefix + "running_requests", "requests generating", registry=r)
        running_gauge.set_function(running)
        queue = Gauge(prefix + "queue_depth", "requests waiting for a slot", registry=r)
        queue.set_function(waiting)
        self.ready = Gauge(prefix + "ready", "1 once the models are loaded", registry=r)

    def finished(self, stats: Stats) -> None:
        self.prompt_tokens.inc(stats.input_tokens)
        self.completion_tokens.inc(stats.tokens)
        self.ensembled.inc(stats.ensembled_tokens)
        self.ensemble_rate.observe(stats.ensemble_rate)
        if stats.first_delta_seconds is not None:
            self.first_token.observe(stats.first_delta_seconds)
        for member in stats.failed:
            self.member_failures.labels(member).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
