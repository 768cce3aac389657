"""The server's Prometheus metrics (GET /metrics), one registry per server.

Names follow vLLM's (`vllm:num_requests_waiting` -> `servelab_num_requests_waiting`, ...), so
dashboards carry over. The queue and KV gauges are read from the scheduler when scraped (nothing
per step); the histograms take a whole step's values at once (numpy), so a step of 256 sequences
costs one call, not 256. Times are seconds of the engine's clock (time.perf_counter): TTFT from
the request's arrival at the server to its first token, inter-token latency between consecutive
tokens of one request.
"""
from __future__ import annotations

import bisect
import threading

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# no `*_created` sample beside every counter (vLLM turns them off too)
disable_created_metrics()

SMALL_BATCH = 16         # observe() counts this many values or fewer in Python, more with numpy

# vLLM's buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# vLLM's, with finer buckets under 10 ms (a GPU's usual inter-token latency)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class BulkHistogram:
    """A Prometheus histogram that takes many observations per call (a registry collector)."""

    def __init__(self, name: str, doc: str, buckets, label: tuple[str, str], registry: CollectorRegistry):
        self.name, self.doc, self.label = name, doc, label
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self._bounds_list = [float(b) for b in buckets]
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)     # per bucket, +Inf last
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, values) -> None:
        n = len(values)
        if not n:
            return
        if n <= SMALL_BATCH:        # a few values (a quiet server's step): numpy's call overhead would dominate
            bounds, counts = self._bounds_list, [0] * len(self._counts)
            for x in values:
                counts[bisect.bisect_left(bounds, x)] += 1      # searchsorted's side="left": le is inclusive
            with self._lock:
                self._counts += counts
                self._sum += float(sum(values))
            return
        v = np.asarray(values, dtype=np.float64)
        counts = np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(v.sum())

    @property
    def count(self) -> int:
        return int(self._counts.sum())

    def collect(self):
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total = self._sum
        family = HistogramMetricFamily(self.name, self.doc, labels=[self.label[0]])
        les = [f"{b:g}" for b in self.bounds] + ["+Inf"]
        family.add_metric([self.label[1]], list(zip(les, cumulative.tolist())), total)
        yield family

    def describe(self):
        return []


# the gauges read from the scheduler, in the order of ServerMetrics' queue_stats
QUEUE_GAUGES = (("servelab_num_requests_waiting", "Requests queued for admission (preempted ones too)"),
                ("servelab_num_requests_running", "Requests in the running batch"),
                ("servelab_num_requests_swapped", "Requests whose KV blocks are swapped to CPU"),
                ("servelab_kv_cache_usage_perc", "Fraction of GPU KV blocks in use (0-1)"))


class ServerMetrics:
    def __init__(self, model_name: str, scheduler=None, queue_stats=None):
        """The queue and KV gauges read `scheduler` (the engine in this process) or, for an engine in its
        own process, queue_stats() -> (waiting, running, swapped, KV blocks used / total) of its last step."""
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model_name}
        self._model = model_name

        def gauge(name, doc, read):
            g = Gauge(name, doc, list(labels), registry=r).labels(**labels)
            g.set_function(read)
            return g

        def counter(name, doc):
            return Counter(name, doc, list(labels), registry=r).labels(**labels)

        s = scheduler
        if s is not None:
            bm = s.block_manager
            reads = (lambda: len(s.waiting), lambda: len(s.running), lambda: len(s.swapped),
                     lambda: bm.num_used_blocks / bm.num_kvcache_blocks)
            for (name, doc), read in zip(QUEUE_GAUGES, reads):
                gauge(name, doc, read)
        elif queue_stats is not None:
            for i, (name, doc) in enumerate(QUEUE_GAUGES):
                gauge(name, doc, lambda i=i: queue_stats()[i])
        gauge("servelab_prefix_cache_hit_rate", "Prompt tokens served by the prefix cache / prompt tokens "
                                                "admitted, since start (0-1)",
              lambda: self._hits / self._queries if self._queries else 0.0)
        self.prefix_queries = counter("servelab_prefix_cache_queries",
                                      "Prompt tokens admitted (first admission), the prefix cache's queries")
        self.prefix_hits = counter("servelab_prefix_cache_hits", "Prompt tokens served by the prefix cache")
        self.preemptions = counter("servelab_num_preemptions", "Preemptions (by recompute or swap)")
        self.prompt_tokens = counter("servelab_prompt_tokens",
                                     "Prompt tokens of admitted requests (once per prompt, whatever its n)")
        self.generation_tokens = counter("servelab_generation_tokens", "Tokens generated")
        self.aborted = counter("servelab_request_aborted", "Requests aborted (client gone, or shutdown)")
        self.rejected = counter("servelab_request_rejected", "Requests refused with 429 (waiting limit)")
        self.policy_rejected = counter("servelab_request_policy_rejected",
                                       "Requests the scheduling policy rejected while they waited (503)")
        self._success = Counter("servelab_request_success", "Requests finished, by finish reason",
                                [*labels, "finished_reason"], registry=r)
        label = ("model_name", model_name)
        self.ttft = BulkHistogram("servelab_time_to_first_token_seconds", "Arrival to first token", TTFT_BUCKETS,
                                  label, r)
        self.itl = BulkHistogram("servelab_inter_token_latency_seconds", "Time between consecutive tokens",
                                 ITL_BUCKETS, label, r)
        self.e2e = BulkHistogram("servelab_e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS,
                                 label, r)
        self._hits = self._queries = 0

    def finished(self, reason: str) -> None:
        self._success.labels(model_name=self._model, finished_reason=reason).inc()

    def admitted(self, num_prompt_tokens: int, num_cached_tokens: int, first_of_prompt: bool = True) -> None:
        """A sequence's first admission. The prefix cache is queried per sequence; the prompt tokens count once
        per prompt (first_of_prompt: no other choice of its prompt was admitted before), as usage does."""
        if first_of_prompt:
            self.prompt_tokens.inc(num_prompt_tokens)
        self.prefix_queries.inc(num_prompt_tokens)
        self.prefix_hits.inc(num_cached_tokens)
        self._queries += num_prompt_tokens
        self._hits += num_cached_tokens

    def scrape(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
