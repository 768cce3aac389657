"""servelab-serve over an engine with overlap scheduling (docs/overlap.md): streamed and whole completions
carry the synchronous engine's tokens, never a placeholder of the step in flight."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from engine.core.sequence import SamplingParams  # noqa: E402
from tests.experiments.serve.server import make_llm, running_server  # noqa: E402


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine_thread", "engine_process"])
def test_overlapped_engine_serves_the_synchronous_tokens(ckpt, engine_process):
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42], [300, 2, 17, 8, 8, 90, 4]]
    ref_llm = make_llm(ckpt)
    ref = ref_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    decode = ref_llm.tokenizer.decode
    with running_server(ckpt, overlap_scheduling=True, engine_process=engine_process) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=30)
        for prompt, out in zip(prompts, ref):
            kwargs = dict(model="tiny", prompt=prompt, max_tokens=10, temperature=0,
                          extra_body={"return_token_ids": True, "ignore_eos": True})
            whole = client.completions.create(**kwargs).choices[0]
            assert whole.model_extra["token_ids"] == out.token_ids
            chunks = list(client.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            assert text == whole.text == " " + decode(out.token_ids, skip_special_tokens=True)
        srv.wait_idle()
        if not engine_process:
            assert srv.llm.scheduler.block_manager.num_used_blocks == 0
