"""Counters, gauges and histograms rendered in the Prometheus text format (version 0.0.4).

Small enough to write here rather than depend on prometheus_client: the server needs three
metric types, labels on one counter, and thread safety (the engine thread observes latencies
while the event loop renders).
"""
from __future__ import annotations

import bisect
import threading

# Seconds; spans a queue wait of a millisecond to a request that runs into the time limit.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    escape = lambda v: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs) + "}"


class Counter:
    def __init__(self, name: str, help_text: str):
        self.name, self.help_text = name, help_text
        self.values: dict[tuple, float] = {}
        self.lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self.lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        with self.lock:
            values = dict(self.values) or {(): 0.0}
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} counter"]
        return lines + [f"{self.name}{_labels(k)} {v:g}" for k, v in sorted(values.items())]


class Gauge:
    def __init__(self, name: str, help_text: str):
        self.name, self.help_text = name, help_text
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} gauge", f"{self.name} {self.value:g}"]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts = [0] * len(buckets)  # per bucket, not cumulative; summed when rendered
        self.count = 0
        self.sum = 0.0
        self.lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self.lock:
            i = bisect.bisect_left(self.buckets, value)
            if i < len(self.buckets):
                self.counts[i] += 1
            self.count += 1
            self.sum += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        with self.lock:
            cumulative = 0
            for bound, n in zip(self.buckets, self.counts):
                cumulative += n
                lines.append(f'{self.name}_bucket{{le="{bound:g}"}} {cumulative}')
            lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
            lines.append(f"{self.name}_sum {self.sum:.6f}")
            lines.append(f"{self.name}_count {self.count}")
        return lines


class ServerMetrics:
    """Everything GET /metrics shows."""

    def __init__(self):
        self.requests = Counter("serve_requests_total", "HTTP requests by path and status code.")
        self.tokens = Counter("serve_generated_tokens_total", "Tokens generated for all requests.")
        self.queue_time = Histogram("serve_queue_seconds", "Time from arrival until generation started.")
        self.first_token = Histogram("serve_time_to_first_token_seconds", "Time from arrival to the first token.")
        self.total_time = Histogram("serve_request_seconds", "Time from arrival to the last token.")
        self.decode_batch = Histogram("serve_decode_batch_size", "Sequences advanced by each shared forward pass.",
                                      BATCH_BUCKETS)
        self.prefix_hits = Counter("serve_prefix_cache_hits_total",
                                   "Requests whose prompt reused cached blocks of an earlier prompt's keys and values.")
        self.prefix_reused_tokens = Counter("serve_prefix_cache_reused_tokens_total",
                                            "Prompt tokens whose keys and values came from the prefix cache.")
        self.prefix_cache_bytes = Gauge("serve_prefix_cache_bytes", "Bytes the prefix cache holds.")
        self.queue_depth = Gauge("serve_queue_depth", "Requests waiting for a batch slot.")
        self.batch_size = Gauge("serve_batch_size", "Sequences in the running batch.")
        self.speculative_proposed = Counter("serve_draft_tokens_proposed_total",
                                            "Tokens the draft model proposed (speculative decoding, --draft).")
        self.speculative_accepted = Counter("serve_draft_tokens_accepted_total",
                                            "Proposed tokens the model's check kept; over the proposed ones, the "
                                            "acceptance rate.")
        self.speculative_passes = Counter("serve_speculative_steps_total",
                                          "Speculative steps, each one forward pass of the model over every row's "
                                          "proposals; generated tokens over decode_batch_size's sum per step is "
                                          "the mean tokens a row gains per pass.")
        self.cancelled = Counter("serve_requests_cancelled_total",
                                 "Generation requests stopped before they finished because their client closed the "
                                 "connection (a disconnect, the playground's Stop) or the server shut down; their "
                                 "batch rows were freed.")
        self.connections_closed = Counter("serve_connections_closed_total",
                                          "Connections the server closed: over_limit (refused on arrival) or "
                                          "read_timeout (a request's bytes came too slowly).")

    def reset(self) -> None:
        """Every figure back to zero (start-up's rehearsal requests are not the clients')."""
        self.__init__()

    def render(self) -> str:
        parts = (self.requests, self.tokens, self.queue_time, self.first_token, self.total_time,
                 self.decode_batch, self.queue_depth, self.batch_size, self.speculative_proposed,
                 self.speculative_accepted, self.speculative_passes, self.cancelled, self.connections_closed,
                 self.prefix_hits, self.prefix_reused_tokens, self.prefix_cache_bytes)
        return "\n".join(line for metric in parts for line in metric.render()) + "\n"
