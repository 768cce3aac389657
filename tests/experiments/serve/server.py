"""A servelab-serve app on loopback in this process, over a tiny CPU checkpoint (tests/engine/tiny_model.py).

    with running_server(ckpt, num_kvcache_blocks=64) as srv:
        srv.url          # http://127.0.0.1:PORT/v1
        srv.llm, srv.engine
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}w9{% endif %}")


def make_checkpoint(path) -> str:
    """A tiny Qwen3 checkpoint with a word-level tokenizer ("w0".."w509", "<eos>" = 511) and a chat template."""
    from tests.engine.tiny_model import make_tiny_qwen3, make_tiny_tokenizer

    make_tiny_qwen3(path)
    tok = make_tiny_tokenizer(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(path))
    return str(path)


@dataclass
class RunningServer:
    url: str            # the OpenAI base URL (…/v1)
    base: str           # http://127.0.0.1:PORT
    llm: object
    engine: object
    app: object
    stop: object = None     # () -> None: uvicorn's shutdown (graceful for grace_s), then the thread joined

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until the engine holds no request and its inbox is empty."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.engine._inbox and not self.llm.has_unfinished() and not self.engine._live:
                return
            time.sleep(0.01)
        raise AssertionError(f"engine not idle after {timeout_s} s: {self.llm.scheduler.num_unfinished} unfinished")


def make_llm(ckpt: str, **options):
    from engine.llm import LLM

    opts = dict(device="cpu", num_kvcache_blocks=128, max_model_len=128, max_num_seqs=16)
    opts.update(options)
    policy, eviction = opts.pop("policy", None), opts.pop("eviction", None)
    return LLM(ckpt, policy=policy, eviction=eviction, **opts)


@contextlib.contextmanager
def running_server(ckpt: str, name: str = "tiny", serve_options=None, llm=None, grace_s=None, **engine_options):
    import uvicorn

    from experiments.serve.app import create_app
    from experiments.serve.config import ServeOptions

    llm = llm or make_llm(ckpt, **engine_options)
    app = create_app(llm, name, serve_options or ServeOptions())
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=grace_s)
    server = uvicorn.Server(config)
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
    try:
        yield running
    finally:
        running.stop()


def run_async(coro):
    return asyncio.run(coro)
