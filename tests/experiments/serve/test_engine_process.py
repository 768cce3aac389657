"""The engine in its own process (serve.engine_process=true, the default of servelab-serve): the thread's tests
run against it (OpenAI client, errors, 429, metrics), a client leaving frees its KV blocks in the engine
process, 1,000 requests with random cancellations leave nothing held, a failed or dead engine process
fails its requests (500 / error event, /health 503) instead of hanging, and no process outlives its server."""
from __future__ import annotations

import asyncio
import functools
import os
import time

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("zmq")

from engine.core.sequence import SamplingParams, Sequence  # noqa: E402
from policies.scheduling.vllm_swap import VLLMSwapPolicy  # noqa: E402
from tests.experiments.serve import server as server_module  # noqa: E402
from tests.experiments.serve import test_engine_states, test_errors, test_metrics, test_openai_client  # noqa: E402
from tests.experiments.serve.server import make_faulty_llm, make_llm, running_server  # noqa: E402
from tests.experiments.serve.test_cancellations import mixed_requests  # noqa: E402
from tests.experiments.serve.test_policy_rejects import RejectsLongPrompts  # noqa: E402

in_process = functools.partial(running_server, engine_process=True)


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:    # a zombie child still answers kill(pid, 0) until it is reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def nothing_held(srv) -> dict:
    state = srv.wait_idle()
    assert state["invariants"] == "", state["invariants"]
    assert state["used_blocks"] == 0 and state["free_blocks"] == state["num_blocks"]
    assert state["cpu_free_blocks"] == state["cpu_blocks"] and not state["cpu_tables"]
    assert not state["generators"] and not srv.engine._table.choices
    return state


@pytest.fixture(scope="module")
def srv(ckpt):
    with in_process(ckpt, max_model_len=128) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("test", [
    test_openai_client.test_models_lists_the_served_name,
    test_openai_client.test_streaming_completion_gives_the_same_text_as_non_streaming,
    test_openai_client.test_several_prompts_and_n_give_one_choice_each,
    test_openai_client.test_seed_repeats_a_sampled_completion,
    test_openai_client.test_stop_string_ends_the_text_before_it,
    test_openai_client.test_stop_token_ids_end_the_output,
], ids=lambda f: f.__name__)
def test_the_openai_client_tests_pass(client, test):
    test(client)


def test_the_chat_tests_pass(srv, client):
    test_openai_client.test_chat_completion_streaming_and_not(client, srv)


def test_greedy_completions_match_the_engine_in_this_process(srv, client, ckpt):
    prompt = [5, 6, 7, 8, 9]
    resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True})
    ref = make_llm(ckpt).generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                                  use_tqdm=False)[0]
    assert resp.choices[0].model_extra["token_ids"] == ref.token_ids
    assert resp.choices[0].text == " " + srv.engine.tokenizer.decode(ref.token_ids, skip_special_tokens=True)


def test_the_error_tests_pass(srv):
    for endpoint, body, param, words in test_errors.CASES:
        test_errors.test_bad_request_names_the_field(srv, endpoint, body, param, words)
    for raw in (b"{not json", b"\xff\xfe", b"[1, 2]", b""):
        test_errors.test_a_body_that_is_not_a_json_object_is_refused(srv, raw)
    test_errors.test_unknown_route_and_method_get_an_openai_body(srv)
    test_errors.test_no_op_values_of_unsupported_fields_are_accepted(srv)
    for endpoint, body, _, _ in test_errors.CASES:
        httpx.post(f"{srv.url}/{endpoint}", json=body, timeout=30)
    nothing_held(srv)


@pytest.mark.parametrize("test", [
    test_errors.test_over_the_waiting_limit_gets_429_with_retry_after,
    test_errors.test_an_api_key_is_required_when_set,
    test_metrics.test_counts_match_the_requests,
    test_metrics.test_preemptions_are_counted_under_memory_pressure,
], ids=lambda f: f.__name__)
def test_the_server_tests_pass(ckpt, test, monkeypatch):
    for module in (test_errors, test_metrics):
        monkeypatch.setattr(module, "running_server", in_process)
    test(ckpt)


def test_a_checkpoint_without_tokenizer_serves_token_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(test_engine_states, "running_server", in_process)
    test_engine_states.test_without_tokenizer_token_ids_are_served_and_text_refused(tmp_path)


def test_a_policy_rejection_gets_503(ckpt):
    with in_process(ckpt, policy=RejectsLongPrompts()) as s:
        r = httpx.post(f"{s.url}/completions", json={"prompt": list(range(1, 20)), "max_tokens": 3}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "policy_rejected"
        assert "longer than 10 tokens" in r.json()["error"]["message"]
        assert httpx.post(f"{s.url}/completions", json={"prompt": [1, 2], "max_tokens": 3}, timeout=30).status_code \
            == 200
        nothing_held(s)
        assert 'servelab_request_policy_rejected_total{model_name="tiny"} 1.0' in httpx.get(f"{s.base}/metrics").text


def test_priority_reaches_the_engine_process(srv):
    r = httpx.post(f"{srv.url}/completions", json={"prompt": [1, 2], "max_tokens": 2, "priority": -3}, timeout=30)
    assert r.status_code == 200
    assert srv.wait_idle()["recent"][-1][3] == -3


def test_disconnect_mid_stream_aborts_and_frees(ckpt):
    factory = functools.partial(make_faulty_llm, ckpt, step_sleep_s=0.01)
    with in_process(ckpt, factory=factory) as s:
        body = {"prompt": list(range(1, 40)), "max_tokens": 80, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{s.url}/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
        assert sum(1 for line in got if line.startswith("data: ")) == 3
        state = nothing_held(s)
        (_, status, num_output, _), = state["recent"]
        assert status == "ABORTED" and 3 <= num_output < 80
        assert s.engine.metrics.aborted._value.get() == 1


def test_1000_mixed_requests_with_cancellations_leak_nothing(ckpt):
    # as tests/experiments/serve/test_cancellations.py's swap case (which also preempts): memory binds
    with in_process(ckpt, num_kvcache_blocks=24, max_num_seqs=16, num_cpu_blocks=64, policy=VLLMSwapPolicy()) as s:
        outcome = asyncio.run(mixed_requests(s.url, 1000, seed=64))
        nothing_held(s)
        m = s.engine.metrics
        assert outcome["done"] + outcome["cancelled"] == 1000
        assert outcome["cancelled"] > 200 and outcome["stopped"] > 0
        assert m.aborted._value.get() > 0 and m.preemptions._value.get() > 0


@pytest.mark.parametrize("fault", ["fail_after_steps", "exit_after_steps"])
def test_a_failed_or_dead_engine_fails_requests_and_health(ckpt, fault):
    factory = functools.partial(make_faulty_llm, ckpt, **{fault: 3})
    with in_process(ckpt, factory=factory) as s:
        assert httpx.get(f"{s.base}/health", timeout=30).status_code == 200
        body = {"prompt": [1, 2], "max_tokens": 20, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{s.url}/completions", json=body, timeout=30) as r:
            data = [line for line in r.iter_lines() if line.startswith("data: ")]
        why = "device lost" if fault == "fail_after_steps" else "exited with code 3"
        assert '"error"' in data[-2] and why in data[-2] and data[-1] == "data: [DONE]"
        h = httpx.get(f"{s.base}/health", timeout=30)
        assert h.status_code == 503 and why in h.json()["error"]["message"]
        r = httpx.post(f"{s.url}/completions", json={"prompt": [1, 2], "max_tokens": 3}, timeout=30)
        assert r.status_code == 503
        assert gone(s.engine.pid)


def test_a_request_in_flight_gets_500_when_the_engine_process_dies(ckpt):
    factory = functools.partial(make_faulty_llm, ckpt, exit_after_steps=2)
    with in_process(ckpt, factory=factory) as s:
        r = httpx.post(f"{s.url}/completions", json={"prompt": [1, 2], "max_tokens": 20, "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 500 and "exited with code 3" in r.json()["error"]["message"]


def test_no_engine_process_outlives_its_server(ckpt):
    with in_process(ckpt) as s:
        pid = s.engine.pid
        assert not gone(pid, 0.1)
    assert gone(pid)


def test_a_factory_that_raises_is_a_start_error(ckpt):
    from experiments.serve.engine_client import ProcessEngine
    with pytest.raises(ValueError, match="num_kvcache_blocks"):
        ProcessEngine.launch(functools.partial(server_module.make_llm, ckpt, num_kvcache_blocks=-1))


def engine_pid(log_lines) -> int:
    import re
    found = [re.search(r"engine process running \(pid (\d+)\)", line) for line in log_lines]
    pids = [int(f.group(1)) for f in found if f]
    assert len(pids) == 1, "".join(log_lines)
    return pids[0]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_the_command_leaves_no_engine_process_behind(ckpt, sig):
    import signal

    from tests.experiments.serve.test_shutdown import start
    proc, base, log = start(ckpt, "num_kvcache_blocks=64")
    try:
        pid = engine_pid(log)
        assert any("engine process" in line and "scheduler vllm" in line for line in log), log
        r = httpx.post(f"{base}/v1/completions", json={"prompt": [1, 2], "max_tokens": 3}, timeout=30)
        assert r.status_code == 200
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert gone(pid), f"engine process {pid} outlived the server ({sig})"
    if sig != "SIGKILL":        # a clean stop; after SIGKILL the engine notices its parent is gone
        assert proc.returncode == 0 and "shut down" in out and "Traceback" not in out, "".join(log) + out


def test_the_engine_process_is_the_commands_default(capsys, monkeypatch, tmp_path):
    from tests.experiments.serve.test_cli import serve
    (tmp_path / "config.json").write_text("{}")
    code, out, err = serve(capsys, monkeypatch, "--cfg", f"backend.model_path={tmp_path}")
    assert code == 0 and "engine_process: true" in out, err
    code, out, err = serve(capsys, monkeypatch, f"backend.model_path={tmp_path}", "serve.engine_process=maybe")
    assert code == 2 and err.count("\n") == 1 and "serve.engine_process" in err, err


class _Socket:
    """The channel's poll / recv / send over lists (the engine loop without a process)."""

    def __init__(self, messages=(), when_empty=None):
        import pickle
        self.q = [pickle.dumps(m) for m in messages]
        self.sent = []
        self.when_empty = when_empty

    def poll(self, timeout_ms):
        import pickle
        if not self.q and self.when_empty is not None and self.when_empty():
            self.q.append(pickle.dumps(("stop",)))
        return bool(self.q)

    def recv(self):
        return self.q.pop(0) if self.q else None

    take = recv

    def send(self, data, flags=0):
        import pickle
        self.sent.append(pickle.loads(data))

    send_nowait = send


def test_the_engine_sends_one_message_per_step_with_every_requests_tokens(ckpt):
    from experiments.serve.engine_process import EngineCore, to_wire
    llm = make_llm(ckpt)
    steps = []
    execute = llm.runner.execute
    llm.runner.execute = lambda batch: (steps.append(batch.num_seqs), execute(batch))[1]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    seqs = [llm.make_sequence([1, 2, 3 + i], params, request_id=f"r{i}", arrival_time_s=0.0) for i in range(4)]
    inp = _Socket([("add", [to_wire(s) for s in seqs])], when_empty=lambda: not llm.has_unfinished())
    out = _Socket()
    assert EngineCore(llm, inp, out, os.getppid()).run() == 0
    step_msgs = [m for m in out.sent if m[0] == "step"]
    assert steps == [4] * 5 and len(step_msgs) == 5          # one message per step, not one per token
    for msg in step_msgs:
        records = msg[1]
        assert sorted(r[0] for r in records) == ["r0", "r1", "r2", "r3"]
        assert all(len(r[1]) == 1 for r in records)             # each step's one new token per request
    assert [r[2] for r in step_msgs[-1][1]] == ["length"] * 4 and step_msgs[-1][-1] == (0, 0, 0, 0.0)
    assert out.sent[-1] == ("stopped",)


def test_a_new_sequence_crosses_to_the_engine_as_plain_values():
    import pickle

    from experiments.serve.engine_process import from_wire, to_wire
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=12, ignore_eos=True, seed=3)
    seq = Sequence("cmpl-1-0", list(range(1, 401)), params, arrival_time_s=12.5, eos_token_id=2)
    seq.priority = -4
    back = from_wire(pickle.loads(pickle.dumps(to_wire(seq), protocol=5)))
    for name in ("request_id", "token_ids", "arrival_time_s", "priority", "eos_token_id", "num_prompt_tokens",
                 "max_output_tokens", "status"):
        assert getattr(back, name) == getattr(seq, name), name
    for name in SamplingParams.__slots__:
        assert getattr(back.sampling_params, name) == getattr(params, name), name
    assert len(pickle.dumps(to_wire(seq), protocol=5)) < 0.7 * len(pickle.dumps(seq, protocol=5))


def test_the_engine_process_freezes_its_startup_heap(srv):
    assert srv.engine.probe()["gc_frozen"] > 10_000      # the model and the imports, out of the collector's reach


def test_a_probe_answer_follows_what_the_engine_did_before_it(ckpt):
    # an abort and a probe drained in one turn: the abort's count reaches the server before the probe's answer
    # (a test waiting on the probe then reads the aborted count), not after it with the next step
    from experiments.serve.engine_process import EngineCore, to_wire
    llm = make_llm(ckpt)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    seq = llm.make_sequence([1, 2, 3], params, request_id="r0", arrival_time_s=0.0)
    core = EngineCore(llm, _Socket([("add", [to_wire(seq)])]), _Socket(), os.getppid())
    core._drain(0)
    core.inp = _Socket([("abort", [("r0", True)]), ("probe", 7)])
    core._drain(0)
    kinds = [m[0] for m in core.out.sent]
    assert kinds[-2:] == ["step", "probe"] and core.out.sent[-2][5] == 1 and core.out.sent[-1][1] == 7
    llm.close()
