"""Clients that leave: their requests are aborted and their KV blocks freed; after 1,000 mixed requests with
random cancellations the block manager holds nothing (every invariant checked)."""
from __future__ import annotations

import asyncio
import random
import time

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from engine.core.sequence import SequenceStatus  # noqa: E402
from policies.scheduling.vllm import VLLMPolicy  # noqa: E402
from policies.scheduling.vllm_swap import VLLMSwapPolicy  # noqa: E402
from tests.experiments.serve.server import running_server  # noqa: E402


def nothing_held(srv) -> None:
    srv.wait_idle()
    llm = srv.llm
    bm = llm.scheduler.block_manager
    bm.check_invariants([])             # no live sequence: every ref count must be 0
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == bm.num_kvcache_blocks
    assert bm.num_cpu_free_blocks == bm.num_cpu_blocks and not bm.cpu_tables
    assert not llm._live and not llm.runner.generators and not srv.engine._live and not srv.engine._choices


def slow_steps(llm, monkeypatch, seconds=0.01):
    execute = llm.runner.execute

    def slow(batch):
        time.sleep(seconds)
        return execute(batch)
    monkeypatch.setattr(llm.runner, "execute", slow)


def aborted(srv) -> float:
    return srv.engine.metrics.aborted._value.get()


def submitted(srv):
    """The Sequences the engine was given, through the inbox (kept by wrapping LLM.submit)."""
    return srv.submitted


@pytest.fixture
def srv(ckpt, monkeypatch):
    with running_server(ckpt) as s:
        seqs = []
        submit = s.llm.submit

        def keep(seq):
            seqs.append(seq)
            submit(seq)
        monkeypatch.setattr(s.llm, "submit", keep)
        s.submitted = seqs
        yield s


def test_disconnect_mid_stream_aborts_and_frees(srv, monkeypatch):
    slow_steps(srv.llm, monkeypatch)
    body = {"prompt": list(range(1, 40)), "max_tokens": 80, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{srv.url}/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]           # three chunks (and their blank lines)
    assert sum(1 for line in got if line.startswith("data: ")) == 3
    nothing_held(srv)
    (seq,) = submitted(srv)
    assert seq.status is SequenceStatus.ABORTED and 3 <= seq.num_output_tokens < 80
    assert aborted(srv) == 1


def test_disconnect_while_waiting_for_a_whole_completion_aborts(srv, monkeypatch):
    slow_steps(srv.llm, monkeypatch)

    async def go():
        async with httpx.AsyncClient(timeout=30) as c:
            task = asyncio.ensure_future(c.post(f"{srv.url}/chat/completions", json={
                "messages": [{"role": "user", "content": "w1"}], "max_tokens": 100, "ignore_eos": True}))
            while not submitted(srv) or submitted(srv)[0].num_output_tokens < 2:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    asyncio.run(go())
    nothing_held(srv)
    (seq,) = submitted(srv)
    assert seq.status is SequenceStatus.ABORTED and seq.num_output_tokens < 100
    assert aborted(srv) == 1


async def mixed_requests(url: str, n: int, seed: int, concurrency: int = 32) -> dict:
    """n random requests (completions / chat, streaming or not, n=1..2, some with stop strings); about a
    third are cancelled (a stream closed after a few chunks, a request cancelled after a short wait)."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    outcome = {"done": 0, "cancelled": 0, "stopped": 0}

    async def one(c: httpx.AsyncClient, i: int) -> None:
        chat = rng.random() < 0.4
        stream = rng.random() < 0.5
        body = {"max_tokens": rng.randint(1, 8), "temperature": rng.choice([0, 0.8]), "seed": i,
                "ignore_eos": True, "stream": stream, "n": rng.choice([1, 1, 1, 2])}
        if rng.random() < 0.15:
            body["stop"] = [f"w{rng.randint(1, 5)}"]         # a substring of every word w1, w10, w123, ...
        prompt = [rng.randint(0, 60) for _ in range(rng.randint(1, 40))]     # small ids: prefixes repeat
        if chat:
            body["messages"] = [{"role": "user", "content": " ".join(f"w{t}" for t in prompt)}]
        else:
            body["prompt"] = prompt
        cancel = rng.random() < 0.33
        after = rng.randint(0, 4)
        path = f"{url}/{'chat/completions' if chat else 'completions'}"
        async with sem:
            if stream:
                async with c.stream("POST", path, json=body) as r:
                    assert r.status_code == 200, await r.aread()
                    k = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            k += 1
                            if cancel and k > after:
                                outcome["cancelled"] += 1
                                return
                            assert '"error"' not in line, line
                            if '"finish_reason":"stop"' in line:
                                outcome["stopped"] += 1
                outcome["done"] += 1
            else:
                task = asyncio.ensure_future(c.post(path, json=body))
                if cancel:
                    await asyncio.sleep(rng.random() * 0.02)
                    if not task.done():
                        task.cancel()
                        outcome["cancelled"] += 1
                        try:
                            await task
                        except asyncio.CancelledError:
                            pass
                        return
                r = await task
                assert r.status_code == 200, r.text
                outcome["done"] += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        await asyncio.gather(*[one(c, i) for i in range(n)])
    return outcome


@pytest.mark.parametrize("policy, cpu_blocks", [(VLLMPolicy, 0), (VLLMSwapPolicy, 64)], ids=["recompute", "swap"])
def test_1000_mixed_requests_with_cancellations_leak_nothing(ckpt, policy, cpu_blocks):
    # 24 KV blocks of 16 tokens for up to 16 sequences of up to ~50 tokens: memory binds, so requests are
    # preempted (recomputed or swapped) and some are aborted while preempted or swapped
    with running_server(ckpt, num_kvcache_blocks=24, max_num_seqs=16, num_cpu_blocks=cpu_blocks,
                        policy=policy()) as srv:
        t0 = time.perf_counter()
        outcome = asyncio.run(mixed_requests(srv.url, 1000, seed=cpu_blocks))
        wall = time.perf_counter() - t0
        nothing_held(srv)
        m = srv.engine.metrics
        preempted = m.preemptions._value.get()
        assert outcome["done"] + outcome["cancelled"] == 1000
        assert outcome["cancelled"] > 200 and outcome["stopped"] > 0
        assert aborted(srv) > 0 and preempted > 0
        assert wall < 60, f"1,000 requests took {wall:.1f} s"
