"""servelab-serve's command line: help, the composed config, and one `error:` line for each mistake."""
from __future__ import annotations

import pytest

from experiments.serve import cli
from tests.helpers import exit_code_and_output


def serve(capsys, monkeypatch, *args):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    return exit_code_and_output(capsys, cli.main, list(args))


@pytest.fixture(scope="module")
def fake_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("fake_ckpt")
    (path / "config.json").write_text("{}")     # composition checks only look for it
    return str(path)


def test_help(capsys, monkeypatch):
    code, out, _ = serve(capsys, monkeypatch, "--help")
    assert code == 0 and "backend.model_path=DIR" in out and "serve.port" in out


def test_cfg_prints_the_composed_config_with_the_groups(capsys, monkeypatch, fake_ckpt):
    code, out, err = serve(capsys, monkeypatch, "--cfg", f"backend.model_path={fake_ckpt}", "scheduler=srpt",
                           "victim=most_blocks", "eviction=lfu", "num_kvcache_blocks=77", "serve.port=9001")
    assert code == 0, err
    assert "SRPTPolicy" in out and "MostBlocksVictim" in out and "LFUEviction" in out
    assert "num_kvcache_blocks: 77" in out and "port: 9001" in out and "name: engine" in out


@pytest.mark.parametrize("args, words", [
    ((), ["backend.model_path is null", "servelab-serve backend.model_path="]),
    (("backend.model_path=/nonexistent/ckpt",), ["/nonexistent/ckpt", "config.json"]),
    (("backend.model_path={ckpt}", "serve.prot=1"), ["unknown key serve.prot", "serve.port"]),
    (("backend.model_path={ckpt}", "+serve.prot=1"), ["serve.prot"]),
    (("backend.model_path={ckpt}", "scheduler=fastest"), ["scheduler=fastest", "no such option"]),
    (("backend.model_path={ckpt}", "serve.port=70000"), ["serve.port", "65535"]),
    (("backend.model_path={ckpt}", "serve.port=http"), ["serve.port"]),
    (("backend.model_path={ckpt}", "serve.max_waiting_requests=-1"), ["serve.max_waiting_requests"]),
    (("backend.model_path={ckpt}", "serve.log_level=loud"), ["serve.log_level"]),
    (("backend.model_path={ckpt}", "num_replicas=2"), ["one replica"]),
    (("backend.model_path={ckpt}", "backend.device=cpus"), ["backend.device must be one of", "'cpus'"]),
    (("backend.model_path={ckpt}", "backend.dtype=f16"), ["backend.dtype must be one of", "'f16'"]),
    (("--port", "8000"), ["unknown flag --port", "key=value"]),
])
def test_a_mistake_is_one_error_line(capsys, monkeypatch, fake_ckpt, args, words):
    code, out, err = serve(capsys, monkeypatch, *[a.format(ckpt=fake_ckpt) for a in args])
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], lines[0]


def test_a_port_in_use_is_one_error_line_before_the_engine_loads(capsys, monkeypatch, fake_ckpt):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    built = []
    monkeypatch.setattr(cli, "build_llm", lambda cfg: built.append(cfg))
    monkeypatch.setattr(cli, "launch_engine", lambda cfg, options: built.append(cfg))
    try:
        code, out, err = serve(capsys, monkeypatch, f"backend.model_path={fake_ckpt}", f"serve.port={port}")
    finally:
        taken.close()
    assert code == 2 and not built, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"serve.port={port}" in lines[0] and "already in use" in lines[0] and "serve.port=0" in lines[0]


def test_the_bound_socket_is_the_one_served_and_logged():
    """bind_port's socket (port 0: one the kernel picks) is what uvicorn serves, its address logged as uvicorn does."""
    import logging
    import threading
    import time

    httpx = pytest.importorskip("httpx")
    uvicorn = pytest.importorskip("uvicorn")

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"up"})

    sock = cli.bind_port("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = cli._signal_server_class(sock)(uvicorn.Config(app, port=0, lifespan="off", log_level="info"))
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("uvicorn.error").addHandler(handler)     # after Config: its logging setup drops handlers
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text == "up"
        assert any(f"Uvicorn running on http://127.0.0.1:{port} " in m for m in logged), logged
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        logging.getLogger("uvicorn.error").removeHandler(handler)
