"""The gateway's Prometheus metrics, served at ``GET /metrics``."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .admission import Admission

__all__ = ["Metrics"]


class Metrics:
    """The gateway's metrics, in a registry of its own (one per app, so tests do not share)."""

    def __init__(self, admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "mcp_tool_calls",
            "calls of execute_python_code, get_output and interrupt by outcome (a run's status, "
            "running for an answer while it runs, or the service failure)",
            ["outcome"],
            registry=self.registry,
        )
        self.calls_by_client = Counter(
            "mcp_tool_calls_by_client",
            "the calls of mcp_tool_calls by the client's token name and outcome (with tokens)",
            ["client", "outcome"],
            registry=self.registry,
        )
        self.interpreters_lost = Counter(
            "mcp_interpreters_lost",
            "Calls that found their session's live interpreter gone, by why: memory (the "
            "evaluator's watchdog ended it, the host short of memory) or gone (anything else)",
            ["why"],
            registry=self.registry,
        )
        for why in ("memory", "gone"):
            self.interpreters_lost.labels(why)
        self.duration = Histogram(
            "mcp_tool_call_duration_seconds",
            "Time from the call's arrival to its answer",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80),
            registry=self.registry,
        )
        self.evaluator_errors = Counter(
            "mcp_evaluator_errors",
            "Failures of the evaluation service, by kind",
            ["kind"],
            registry=self.registry,
        )
        self.reads = Counter(
            "mcp_cell_reads",
            "get_output and interrupt calls that read a cell, by what they found: running, "
            "or ended (its result)",
            ["found"],
            registry=self.registry,
        )
        for found in ("running", "ended"):
            self.reads.labels(found)
        in_flight = Gauge(
            "mcp_evaluations_in_flight", "Evaluations running", registry=self.registry
        )
        in_flight.set_function(lambda: admission.in_flight)
        waiting = Gauge(
            "mcp_evaluations_waiting",
            "Calls waiting for a slot, or for their session's call before",
            registry=self.registry,
        )
        waiting.set_function(lambda: admission.waiting)

    def count_running_cells(self, count: Callable[[], int]) -> None:
        """Serve ``mcp_running_cells``, counted by ``count`` when scraped."""
        running = Gauge(
            "mcp_running_cells",
            "Cells that ran on after their call answered (or was left), not read to their end",
            registry=self.registry,
        )
        running.set_function(count)

    def render(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
