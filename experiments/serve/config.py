"""The server's own options (the `serve:` node of conf/serve.yaml) and the schema that adds them to servelab's.

    servelab-serve backend.model_path=... serve.port=8001 serve.max_waiting_requests=512

Everything else (engine sizing, scheduler, victim, eviction, backend.device, ...) is servelab's own
config (experiments/config.py), composed from the same groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore

from experiments.config import ServelabConfig


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"                     # 0.0.0.0 to listen on every interface
    port: int = 8000                            # 0: any free port (the chosen one is logged)
    served_model_name: Optional[str] = None     # the `model` clients send; None: backend.model_path as given
    # more queued (not yet running) requests than this: 429 with Retry-After; None: no limit
    max_waiting_requests: Optional[int] = None
    retry_after_s: int = 1                      # the Retry-After header of a 429, seconds
    # on SIGINT / SIGTERM: in-flight requests get this long to finish, then they are aborted
    shutdown_grace_s: float = 10.0
    # clients must send `Authorization: Bearer <api_key>` to /v1/*; None: no key (e.g. serve.api_key='${oc.env:KEY}')
    api_key: Optional[str] = None
    log_level: str = "info"                     # uvicorn's: critical | error | warning | info | debug
    access_log: bool = False                    # one log line per HTTP request
    # the engine steps in its own process (HTTP, tokenization and detokenization keep this one's GIL to
    # themselves); false: in a thread of the server's process. The command's switch: create_app serves
    # whatever it is given (an LLM: a thread; a launched ProcessEngine: its process)
    engine_process: bool = True
    # with the engine in its own process: after a message, a step or a request, both processes poll their socket
    # with zero timeout (awake, no wake-up when the next message lands) for this long, then block on it again;
    # 0: block at once; None: 50 where the server may use at least 4 cores, else 0 (experiments/serve/spin.py).
    # Idle CPU: at most one window per burst of work. docs/serving.md has the figures
    spin_window_ms: Optional[float] = None


@dataclass
class ServeConfig(ServelabConfig):
    serve: ServeOptions = field(default_factory=ServeOptions)


def register_configs() -> None:
    ConfigStore.instance().store(name="serve_schema", node=ServeConfig)


register_configs()
