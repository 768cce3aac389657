"""experiments/serve/delivery.py: a step's tokens reach the requests before the metrics are taken; the histograms."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from engine.core.sequence import Sequence  # noqa: E402
from experiments.serve.delivery import Choice, Deliveries  # noqa: E402
from experiments.serve.metrics import SMALL_BATCH, TTFT_BUCKETS, ServerMetrics  # noqa: E402


def test_tokens_reach_the_woken_request_before_the_metrics_are_taken():
    metrics = ServerMetrics("m", queue_stats=lambda: (0, 0, 0, 0.0))
    table = Deliveries(metrics)

    async def main():
        queue: asyncio.Queue = asyncio.Queue()
        seq = Sequence("r-0", [1, 2, 3], arrival_time_s=10.0)
        table.track([Choice(0, seq, queue)])
        seen_at_wakeup = []

        async def request():
            item = await queue.get()
            seen_at_wakeup.append((item, metrics.ttft.count, metrics._queries))

        task = asyncio.ensure_future(request())
        await asyncio.sleep(0)          # the request waits on its queue
        # a record: (request_id, new tokens, finish_reason, first_s, last_s, finish_s, num_prompt, num_cached)
        table.on_step([("r-0", [7], None, 10.25, 10.25, None, 3, 1)], num_preempted=2)
        assert metrics.ttft.count == 0  # not yet: after the request's task ran
        await task
        await asyncio.sleep(0)
        return seen_at_wakeup

    seen = asyncio.run(main())
    assert seen == [((0, [7], None, None), 0, 0)]
    assert metrics.ttft.count == 1 and metrics.ttft._sum == pytest.approx(0.25)
    assert metrics._queries == 3 and metrics._hits == 1
    text = metrics.scrape()[0].decode()
    assert 'servelab_num_preemptions_total{model_name="m"} 2.0' in text
    assert 'servelab_generation_tokens_total{model_name="m"} 1.0' in text


def test_a_step_read_without_a_running_loop_is_counted_at_once():
    metrics = ServerMetrics("m", queue_stats=lambda: (0, 0, 0, 0.0))
    table = Deliveries(metrics)

    class Q(list):
        put_nowait = list.append

    q = Q()
    table.track([Choice(0, Sequence("r-0", [1], arrival_time_s=1.0), q)])
    table.on_step([("r-0", [5, 6], "length", 1.5, 1.75, 1.75, 1, 0)], num_preempted=0)
    assert q == [(0, [5, 6], "length", None)]
    assert metrics.ttft.count == 1 and metrics.itl.count == 1 and metrics.e2e.count == 1


def test_small_and_large_observations_count_alike():
    rng = np.random.default_rng(0)
    edges = list(TTFT_BUCKETS)                  # values on a bucket's bound belong to it (le is inclusive)
    values = np.concatenate([rng.exponential(0.05, 200), edges, [0.0, 1e6]]).tolist()
    rng.shuffle(values)
    small = ServerMetrics("a", queue_stats=lambda: (0, 0, 0, 0.0)).ttft
    large = ServerMetrics("b", queue_stats=lambda: (0, 0, 0, 0.0)).ttft
    for i in range(0, len(values), SMALL_BATCH):
        small.observe(values[i:i + SMALL_BATCH])
    large.observe(values)
    assert small._counts.tolist() == large._counts.tolist()
    assert small._sum == pytest.approx(large._sum)
    assert small.count == len(values)
