"""A servelab-serve app on loopback in this process, over a tiny CPU checkpoint (experiments/tiny_checkpoint.py).

    with running_server(ckpt, num_kvcache_blocks=64) as srv:
        srv.url          # http://127.0.0.1:PORT/v1
        srv.llm, srv.engine
    with running_server(ckpt, engine_process=True) as srv:     # the engine in its own process
        srv.engine.probe()   # its bookkeeping (srv.llm is None: the LLM lives in the other process)
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass


def make_checkpoint(path) -> str:
    """A tiny Qwen3 checkpoint with a word-level tokenizer ("w0".."w509", "<eos>" = 511) and a chat template
    (python -m experiments.tiny_checkpoint DIR writes the same)."""
    from experiments.tiny_checkpoint import make_serving_checkpoint
    return make_serving_checkpoint(path)


@dataclass
class RunningServer:
    url: str            # the OpenAI base URL (…/v1)
    base: str           # http://127.0.0.1:PORT
    llm: object
    engine: object
    app: object
    stop: object = None     # () -> None: uvicorn's shutdown (graceful for grace_s), then the thread joined
    thread_id: int | None = None    # the native id of uvicorn's thread (its CPU time: /proc/self/task/<id>/stat)

    def wait_idle(self, timeout_s: float = 30.0) -> dict | None:
        """Until the engine holds no request and its inbox is empty; the engine process's probe, if one."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.llm is None:
                state = self.engine.probe()
                if not (state["live"] or state["tracked"] or state["unfinished"] or self.engine.num_waiting()):
                    return state
            elif not self.engine._inbox and not self.llm.has_unfinished() and not self.engine._live:
                return None
            time.sleep(0.01)
        raise AssertionError(f"engine not idle after {timeout_s} s")


def make_llm(ckpt: str, **options):
    from engine.llm import LLM

    opts = dict(device="cpu", num_kvcache_blocks=128, max_model_len=128, max_num_seqs=16)
    opts.update(options)
    policy, eviction = opts.pop("policy", None), opts.pop("eviction", None)
    return LLM(ckpt, policy=policy, eviction=eviction, **opts)


def make_faulty_llm(ckpt: str, step_sleep_s: float = 0.0, fail_after_steps: int | None = None,
                    exit_after_steps: int | None = None, **options):
    """make_llm's LLM whose steps sleep step_sleep_s first, raise RuntimeError("device lost") after
    fail_after_steps steps, or end the process (os._exit(3), a crash) after exit_after_steps: an engine
    process's factory (functools.partial of this), where a test cannot reach the LLM to patch it."""
    import os

    llm = make_llm(ckpt, **options)
    execute, calls = llm.runner.execute, []

    def step(batch):
        calls.append(1)
        if fail_after_steps is not None and len(calls) > fail_after_steps:
            raise RuntimeError("device lost")
        if exit_after_steps is not None and len(calls) > exit_after_steps:
            os._exit(3)
        if step_sleep_s:
            time.sleep(step_sleep_s)
        return execute(batch)
    llm.runner.execute = step
    return llm


@contextlib.contextmanager
def running_server(ckpt: str, name: str = "tiny", serve_options=None, llm=None, grace_s=None,
                   engine_process: bool = False, factory=None, spin_window_ms=None, **engine_options):
    """engine_process: the engine in its own process, its LLM made by factory() (default: make_llm's), both
    processes spinning spin_window_ms after activity (None: serve.spin_window_ms's auto rule)."""
    import functools

    from experiments.serve.app import create_app
    from experiments.serve.config import ServeOptions
    from experiments.serve.engine_client import ProcessEngine

    if engine_process:
        proc = ProcessEngine.launch(factory or functools.partial(make_llm, ckpt, **engine_options),
                                    log_level="warning", spin_window_ms=spin_window_ms)
        with contextlib.ExitStack() as stack:
            stack.callback(proc.close)
            with _serving(create_app(proc, name, serve_options or ServeOptions()), None, grace_s) as running:
                yield running
        return
    llm = llm or make_llm(ckpt, **engine_options)
    with _serving(create_app(llm, name, serve_options or ServeOptions()), llm, grace_s) as running:
        yield running


@contextlib.contextmanager
def _serving(app, llm, grace_s):
    import uvicorn

    from experiments.serve.graceful import GracefulServer

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=grace_s)
    server = GracefulServer(config)         # the shutdown servelab-serve has
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    running = RunningServer(f"{base}/v1", base, llm, app.state.server.engine, app)
    running.stop = lambda: (setattr(server, "should_exit", True), thread.join(30))
    running.thread_id = thread.native_id
    try:
        yield running
    finally:
        running.stop()


def run_async(coro):
    return asyncio.run(coro)
