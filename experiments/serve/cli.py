"""The `servelab-serve` command (also `python -m experiments.serve`): the engine behind the OpenAI API.

    servelab-serve backend.model_path=~/models/Qwen3-0.6B
    servelab-serve backend.model_path=... scheduler=srpt eviction=lfu num_kvcache_blocks=4096 serve.port=8001
    servelab-serve --cfg backend.model_path=...     # print the composed config and exit
    servelab-serve --help

The config is servelab's (conf/serve.yaml composes conf/config.yaml with backend=engine), so every
group and engine key of `servelab` applies, plus `serve.*` (experiments/serve/config.py). A mistake
(an unknown key or option, a missing checkpoint) prints one `error:` line and exits with status 2.
The port is bound before the engine loads (a port in use is that one line, not a failure after the
checkpoint loaded); connections are accepted once the engine is ready. SIGINT / SIGTERM stop accepting
connections, give in-flight requests serve.shutdown_grace_s to finish, abort the rest (their KV blocks
freed) and exit with status 0.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import experiments.serve.config  # noqa: F401  (registers serve_schema before Hydra composes)
from experiments.user_errors import TRACEBACK_ENV, MissingExtraError, fail, is_user_error, one_line

USAGE = """usage: servelab-serve backend.model_path=DIR [key=value ...] [--cfg] [--help]

Serves the checkpoint in DIR (config.json, *.safetensors, tokenizer files) over the OpenAI API:
POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models, /health, /metrics.

Options are servelab's Hydra overrides:
  scheduler=vllm|srpt|...  eviction=lru|lfu|...  victim=...     policies (conf/ groups)
  num_kvcache_blocks=N max_num_seqs=N max_model_len=N block_size=N enable_chunked_prefill=true ...
  backend.device=cuda|cpu backend.dtype=auto|bfloat16|... backend.enforce_eager=true
  serve.host=127.0.0.1 serve.port=8000 serve.served_model_name=NAME
  serve.max_waiting_requests=N serve.retry_after_s=1 serve.shutdown_grace_s=10 serve.log_level=info
  serve.engine_process=true|false   the engine in its own process (default) or in a thread of the server's
  serve.spin_window_ms=50           after activity both processes poll without sleeping this long (0: block;
                                    default null: 50 on 4 cores or more, else 0)
--cfg prints the composed config; docs/serving.md has the details."""


def compose(overrides: list[str]) -> DictConfig:
    """The composed, checked config (ValueError / Hydra errors for the user's mistakes)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from experiments.compose import CONF_DIR
    from experiments.config_check import check_config
    from experiments.run import quote_tilde

    GlobalHydra.instance().clear()      # an earlier composition in this process (tests) would refuse a new one
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="servelab-serve"):
        cfg = hydra_compose(config_name="serve", overrides=[quote_tilde(a) for a in overrides])
    check_config(cfg)
    if cfg.backend.get("model_path") is None:
        raise ValueError("backend.model_path is null: give the checkpoint directory to serve, e.g. "
                         "servelab-serve backend.model_path=~/models/Qwen3-0.6B")
    path = Path(str(cfg.backend.model_path))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"backend.model_path={path} has no config.json; give a Hugging Face checkpoint "
                                "directory (config.json + *.safetensors)")
    if int(cfg.num_replicas) != 1:
        raise ValueError(f"servelab-serve runs one replica; got num_replicas={cfg.num_replicas} (start one server "
                         "per replica)")
    from experiments.runner_engine import EngineRunConfig
    EngineRunConfig.from_config(cfg)        # the engine's settings checked before the port is taken
    s = cfg.serve
    if not 0 <= int(s.port) <= 65535:
        raise ValueError(f"serve.port must be in [0, 65535], got {s.port}")
    if s.max_waiting_requests is not None and int(s.max_waiting_requests) < 0:
        raise ValueError(f"serve.max_waiting_requests must be >= 0 or null (no limit), got {s.max_waiting_requests}")
    if int(s.retry_after_s) < 0 or float(s.shutdown_grace_s) < 0:
        raise ValueError(f"serve.retry_after_s and serve.shutdown_grace_s must be >= 0, got {s.retry_after_s} and "
                         f"{s.shutdown_grace_s}")
    from experiments.serve.spin import resolve_spin_window_ms
    resolve_spin_window_ms(s.spin_window_ms)        # its one-line error for a negative window
    if str(s.log_level) not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise ValueError(f"serve.log_level must be critical, error, warning, info, debug or trace, got "
                         f"{s.log_level!r}")
    return cfg


def build_llm(cfg: DictConfig):
    """The engine the config describes, with its scheduling and eviction policies (victim inside the scheduler)."""
    from hydra.utils import instantiate

    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as e:
        raise MissingExtraError("servelab-serve needs the engine extra (torch is not installed): "
                                "pip install -e '.[engine,serve]' (install the torch build for your machine "
                                "first)") from e
    from engine.llm import LLM
    from experiments.runner_engine import EngineRunConfig

    policy = instantiate(cfg.scheduler, _convert_="all")
    eviction = instantiate(cfg.eviction, _convert_="all")
    return LLM(EngineRunConfig.from_config(cfg), policy=policy, eviction=eviction)


def build_llm_from(config: dict):
    """build_llm of a resolved config's container (what the spawned engine process receives)."""
    return build_llm(OmegaConf.create(config))


def launch_engine(cfg: DictConfig, options):
    """The engine in its own process (experiments/serve/engine_client.py), its LLM built there from `cfg`."""
    import functools

    from experiments.serve.engine_client import ProcessEngine

    container = OmegaConf.to_container(cfg, resolve=True)
    return ProcessEngine.launch(functools.partial(build_llm_from, container), log_level=options.log_level,
                                spin_window_ms=options.spin_window_ms)


def serve_options(cfg: DictConfig):
    from experiments.serve.config import ServeOptions
    return ServeOptions(**OmegaConf.to_container(cfg.serve, resolve=True))


def served_name(cfg: DictConfig) -> str:
    name = cfg.serve.get("served_model_name")
    return str(name) if name else str(cfg.backend.model_path)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(USAGE)
        return
    show = "--cfg" in args
    args = [a for a in args if a != "--cfg"]
    bad = [a for a in args if a.startswith("-")]
    if bad:
        fail(f"unknown flag {bad[0]}; options are key=value overrides (servelab-serve --help)")
    wanted = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ[TRACEBACK_ENV] = "1" if wanted else "0"
    try:
        cfg = compose(args)
        if show:
            print(OmegaConf.to_yaml(cfg, resolve=True), end="")
            return
        options = serve_options(cfg)
        _logging(options.log_level)
        sock = bind_port(options.host, int(options.port))
    except Exception as e:
        if wanted or not is_user_error(e):
            raise
        fail(one_line(e).replace("`servelab --cfg job`", "`servelab-serve --cfg`"))
    try:
        llm = launch_engine(cfg, options) if options.engine_process else build_llm(cfg)
    except Exception as e:
        sock.close()
        if wanted or not is_user_error(e):
            raise
        fail(one_line(e).replace("`servelab --cfg job`", "`servelab-serve --cfg`"))
    try:
        run(llm, served_name(cfg), options, sock)
    finally:
        llm.close()


def bind_port(host: str, port: int):
    """A TCP socket bound to (host, port), not listening yet (a client connecting before the engine is ready is
    refused, not left waiting); ValueError naming serve.port (or serve.host) when it cannot be bound. Port 0: a
    free port the kernel picks. SO_REUSEADDR as uvicorn sets it, so a port in TIME_WAIT after a restart binds."""
    import errno
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ValueError(f"serve.host={host!r} is not an address of this machine ({e.strerror}); give e.g. "
                         "serve.host=127.0.0.1 or serve.host=0.0.0.0") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"serve.port={port}: {host}:{port} is already in use (another server?); give another "
                             f"port, e.g. serve.port={port + 1 if port < 65535 else 8000}, or serve.port=0 (any free "
                             "port, logged)") from None
        if e.errno == errno.EACCES:
            raise ValueError(f"serve.port={port}: binding {host}:{port} is not permitted (ports below 1024 need "
                             "privileges); give a port >= 1024, or serve.port=0 (any free port, logged)") from None
        raise ValueError(f"serve.host={host!r} serve.port={port}: cannot listen there ({e.strerror}); give an "
                         "address of this machine (serve.host=127.0.0.1 or 0.0.0.0)") from None
    return sock


def run(llm, name: str, options, sock=None) -> None:
    """Serves on `sock` (bind_port's; None: binds serve.host / serve.port now) until SIGINT / SIGTERM (uvicorn's
    handlers), then shuts down as the module docstring says."""
    try:
        import uvicorn

        from experiments.serve.app import create_app
    except ModuleNotFoundError as e:
        raise SystemExit(f"error: servelab-serve needs the serve extra ({e.name} is not installed): "
                         "pip install -e '.[serve]'") from None
    from experiments.serve.engine_process import freeze_startup_heap

    if sock is None:
        sock = bind_port(options.host, int(options.port))
    app = create_app(llm, name, options)
    freeze_startup_heap()       # this process's too (the engine's, with serve.engine_process=false)
    config = uvicorn.Config(app, host=options.host, port=int(options.port), log_level=options.log_level,
                            access_log=options.access_log, timeout_graceful_shutdown=options.shutdown_grace_s,
                            lifespan="on")
    server = _signal_server_class(sock)(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    logging.getLogger("servelab.serve").info("shut down")


def _signal_server_class(sock):
    from experiments.serve.graceful import GracefulServer

    class QuietExitServer(GracefulServer):
        """uvicorn's server, less the re-raise of SIGINT / SIGTERM after its graceful shutdown (which
        would end the process by the signal, or with a KeyboardInterrupt traceback, before the engine
        is closed): a signal is a request to shut down, and the shutdown is clean. It serves `sock` and
        logs its address as uvicorn does for a host and port (uvicorn logs nothing for given sockets)."""

        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:
                host, port = sock.getsockname()[:2]
                where = f"[{host}]" if ":" in host else host
                logging.getLogger("uvicorn.error").info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)",
                                                        where, port)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    return QuietExitServer


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper() if level != "trace" else "DEBUG",
                        format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    main()
