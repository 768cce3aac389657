"""The server's Prometheus metrics (GET /metrics), one registry per server.

Names follow vLLM's (`vllm:num_requests_waiting` -> `servelab_num_requests_waiting`, ...), so
dashboards carry over. Gauges are set after every engine step; times are seconds of the engine's
clock (time.perf_counter): TTFT from the request's arrival at the server to its first token,
inter-token latency between consecutive tokens of one request.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# no `*_created` sample beside every counter and histogram (vLLM turns them off too)
disable_created_metrics()

# vLLM's buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# vLLM's, with finer buckets under 10 ms (a GPU's usual inter-token latency)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model_name}

        def gauge(name, doc):
            return Gauge(name, doc, list(labels), registry=r).labels(**labels)

        def counter(name, doc):
            return Counter(name, doc, list(labels), registry=r).labels(**labels)

        self.waiting = gauge("servelab_num_requests_waiting", "Requests queued for admission (preempted ones too)")
        self.running = gauge("servelab_num_requests_running", "Requests in the running batch")
        self.swapped = gauge("servelab_num_requests_swapped", "Requests whose KV blocks are swapped to CPU")
        self.kv_usage = gauge("servelab_kv_cache_usage_perc", "Fraction of GPU KV blocks in use (0-1)")
        self.prefix_hit_rate = gauge("servelab_prefix_cache_hit_rate",
                                     "Prompt tokens served by the prefix cache / prompt tokens admitted, "
                                     "since start (0-1)")
        self.prefix_queries = counter("servelab_prefix_cache_queries",
                                      "Prompt tokens admitted (first admission), the prefix cache's queries")
        self.prefix_hits = counter("servelab_prefix_cache_hits", "Prompt tokens served by the prefix cache")
        self.preemptions = counter("servelab_num_preemptions", "Preemptions (by recompute or swap)")
        self.prompt_tokens = counter("servelab_prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("servelab_generation_tokens", "Tokens generated")
        self.aborted = counter("servelab_request_aborted", "Requests aborted (client gone, or shutdown)")
        self.rejected = counter("servelab_request_rejected", "Requests refused with 429 (waiting limit)")
        self._success = Counter("servelab_request_success", "Requests finished, by finish reason",
                                [*labels, "finished_reason"], registry=r)
        self._model = model_name
        self.ttft = Histogram("servelab_time_to_first_token_seconds", "Arrival to first token", list(labels),
                              buckets=TTFT_BUCKETS, registry=r).labels(**labels)
        self.itl = Histogram("servelab_inter_token_latency_seconds", "Time between consecutive tokens",
                             list(labels), buckets=ITL_BUCKETS, registry=r).labels(**labels)
        self.e2e = Histogram("servelab_e2e_request_latency_seconds", "Arrival to last token", list(labels),
                             buckets=E2E_BUCKETS, registry=r).labels(**labels)
        self._hits = self._queries = 0

    def finished(self, reason: str) -> None:
        self._success.labels(model_name=self._model, finished_reason=reason).inc()

    def admitted(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.prefix_queries.inc(num_prompt_tokens)
        self.prefix_hits.inc(num_cached_tokens)
        self._queries += num_prompt_tokens
        self._hits += num_cached_tokens
        self.prefix_hit_rate.set(self._hits / self._queries if self._queries else 0.0)

    def scrape(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
