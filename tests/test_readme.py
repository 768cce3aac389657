"""The README works verbatim: every command it shows runs, shortened, in a fresh-clone layout.

The README's commands are its fenced shell blocks (one command per line, `a && b` split into parts),
its fenced Python blocks, and its inline code spans that start with a command (`servelab ...`,
`python ...`, `bash ...`, a `*.sh` script). COMMANDS maps each one, exactly as written, to how it is
run here (overrides appended, tokens replaced, what to check afterwards) or to why it is not; a
README command missing from the table fails test_every_readme_command_is_in_the_table.

The layout is a fresh clone placed beside ../shared: the repository's files are copied into
<tmp>/servelab with <tmp>/shared pointing at the real ../shared, so `../shared/traces/<file>` resolves
as the README says and outputs/ and sweeps/ land in the copy. `servelab` and `servelab-report` run as
`python -m experiments.run` / `experiments.report` (the pyproject scripts, checked below) with the copy
on PYTHONPATH, so the code under test is the copy's, not an installed one.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import ROOT, TRACES, TRACES_REL, trace_file

README = ROOT / "README.md"
SCRIPTS = {"servelab": "experiments.run", "servelab-report": "experiments.report",
           "servelab-serve": "experiments.serve.cli"}
COMMAND_WORDS = {"servelab", "servelab-report", "servelab-serve", "python", "python3", "bash", "pip", ".ci/run"}
TIMEOUT_S = 180
# Fields each run's summary.json holds, as the README lists them.
SUMMARY_METRICS = ("request_throughput_rps", "output_throughput_tps", "ttft_s_p50", "ttft_s_p99", "tpot_s_p50",
                   "e2e_s_p50", "normalized_latency_s_p50", "num_preemptions", "prefix_cache_hit_rate")


# -- the README's commands ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Shown:
    text: str          # the command as the README shows it (a shell line or part, or a whole Python block)
    kind: str          # "shell" | "python"


def _strip_comment(line: str) -> str:
    """`cmd   # note` -> `cmd` (the README's comments follow whitespace; no `#` inside its arguments)."""
    return re.sub(r"\s+#\s.*$", "", line).strip()


def readme_commands(text: str) -> list[Shown]:
    """Every command in README text, in order (see the module docstring for what counts)."""
    shown, prose, lines = [], [], text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```\s*(\w*)\s*$", lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        lang, body = m.group(1).lower(), []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if lang == "python":
            shown.append(Shown("\n".join(body).strip(), "python"))
        elif lang in ("bash", "sh", "shell"):
            for line in _join_continuations(body):
                line = " ".join(_strip_comment(line).split())
                if line and not line.startswith("#"):
                    shown.extend(Shown(part.strip(), "shell") for part in line.split("&&"))
        prose.append("")
    for span in re.findall(r"`([^`]+)`", "\n".join(prose)):
        span = " ".join(span.split())
        first = span.split(" ")[0]
        if first in COMMAND_WORDS or first.endswith(".sh"):
            shown.append(Shown(span, "shell"))
    return list(dict.fromkeys(shown))


def _join_continuations(body: list[str]) -> list[str]:
    out, cur = [], ""
    for line in body:
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    if cur:
        out.append(cur)
    return out


# -- how each command runs here -----------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Run the command with `replace` applied (exact substrings; each must occur) and `append` added.

    {ckpt} in either stands for a tiny random Qwen3 checkpoint (tests/engine/tiny_model.py).
    check names a checker below; needs is the README command that must have run first; jobs is the number
    of runs a shortened sweep makes."""
    check: str
    append: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()
    needs: str | None = None
    jobs: int = 1


@dataclass(frozen=True)
class Excluded:
    reason: str


SHORT = ("workload.max_requests=200",)
SWEEP = ("servelab -m name=kv_pressure num_kvcache_blocks=3000 scheduler=fcfs,vllm,srpt "
         "workload.arrival.rate_rps=10,20,30")
BAND_SWEEP = ("servelab -m name=band_demo model=qwen3_0p6b hardware=h100_sxm backend/cost_model=calibrated "
              "backend.cost_model.profile=benchmarks/results/generalize/h100_1205c/profile_h100_1205c.json "
              "num_kvcache_blocks=600 scheduler=vllm,vllm_swap,sjf workload.num_requests=500 "
              "workload.arrival.rate_rps=25")
FCFS_VS_PREEMPTIVE = ("servelab -m experiment=fcfs_vs_preemptive "
                      "workload.path=../shared/traces/AzureLLMInferenceTrace_conv.csv")
TINY_ENGINE_RUN = ("backend.device=cpu", "max_model_len=1024", "num_kvcache_blocks=256", "swap_space_gib=0",
                   "workload.max_requests=4", "workload/prompt_len=fixed", "workload.prompt_len.tokens=32",
                   "workload/output_len=fixed", "workload.output_len.tokens=8")
NEEDS_CUDA = "needs a CUDA GPU (and builds or reads a full-size checkpoint)"

COMMANDS: dict[str, Run | Excluded] = {
    "python3 -m venv .venv": Excluded("creates a virtual environment; .ci/run makes its own"),
    ". .venv/bin/activate": Excluded("enters that environment (the test runs in one already)"),
    "pip install -e .": Excluded("installs the package; .ci/run installs it in a fresh virtual environment"),
    "servelab": Run("run", SHORT),
    "pip install torch==2.13.0 -e '.[engine,test]'": Excluded("the install .ci/run performs"),
    "python -m pytest": Excluded("the suite this file belongs to (.ci/run runs it)"),
    ".ci/run": Excluded("CI itself: creates a virtual environment and installs torch"),
    "servelab scheduler=srpt eviction=lfu num_kvcache_blocks=2000": Run("run", SHORT),
    "servelab workload=azure workload.path=../shared/traces/AzureLLMInferenceTrace_conv.csv "
    "workload.target_rate_rps=4": Run("run", SHORT),
    "servelab num_replicas=8 router=prefix_affinity workload=mooncake "
    "workload.path=../shared/traces/conversation_trace.jsonl": Run("run", SHORT),
    SWEEP: Run("sweep", ("workload.max_requests=300",),
               (("workload.arrival.rate_rps=10,20,30", "workload.arrival.rate_rps=30"),), jobs=3),
    "servelab-report sweeps/kv_pressure": Run("report", needs=SWEEP),
    BAND_SWEEP: Run("sweep", jobs=3),
    "servelab-report sweeps/band_demo": Run("report", needs=BAND_SWEEP),
    "python: from engine.llm import LLM": Run("python", replace=(('"/path/to/Qwen3-0.6B"', '"{ckpt}"'),)),
    "servelab backend=engine backend.model_path=...": Run("engine_run", TINY_ENGINE_RUN,
                                                          (("backend.model_path=...", "backend.model_path={ckpt}"),)),
    "python -m experiments.validate": Excluded("needs a checkpoint (--model) and --out-dir: docs/validation.md has "
                                               "the full commands; tests/experiments/test_validation.py runs it on "
                                               "a tiny checkpoint"),
    "python -m experiments.real_vs_real": Excluded("needs the real-run folders of two validation runs; "
                                                   "tests/experiments/test_validation.py covers it"),
    "servelab num_replicas=8 router=R workload=mooncake workload.path=../shared/traces/conversation_trace.jsonl "
    "workload.max_requests=2000": Excluded("a template (R: each router) quoted in the results table; "
                                          "tests/sim/test_router_balance.py runs every router on the trace"),
    "python -m experiments.profile --max-model-len N": Excluded("times the engine's step shapes on a GPU; "
                                                                "tests/experiments/test_profile_grid.py checks "
                                                                "the grid on CPU"),
    "bash benchmarks/gpu_engine.sh --out DIR": Excluded(NEEDS_CUDA),
    "benchmarks/gpu_validate.sh": Excluded(NEEDS_CUDA),
    "benchmarks/gpu_generalize.sh": Excluded(NEEDS_CUDA),
    "python -m experiments.generalize": Excluded("needs the kept real runs (benchmarks/results/generalize/"
                                                 "real_h200.tar.xz, unpacked to /tmp); "
                                                 "tests/experiments/test_generalize.py runs "
                                                 "it on tiny-model runs"),
    "python benchmarks/swap_speed.py --out benchmarks/results/swap_speed_h200.json": Excluded(NEEDS_CUDA),
    "python benchmarks/decode_partition.py": Excluded(NEEDS_CUDA),
    "python benchmarks/gpu_fused_qkv.py --out DIR/gpu_fused_qkv_h200.json": Excluded(NEEDS_CUDA),
    "python benchmarks/sim_speed.py": Excluded("a benchmark of minutes (a 1M-request run among them); its figures "
                                               "are measured by hand"),
    FCFS_VS_PREEMPTIVE: Run("sweep", ("scheduler=fcfs,vllm", "workload.target_rate_rps=4",
                                      "workload.max_requests=200"), jobs=2),
    "servelab-report sweeps/fcfs_vs_preemptive": Run("report", needs=FCFS_VS_PREEMPTIVE),
    "servelab experiment=fcfs_vs_vtc scheduler=vtc 'scheduler.tenant_weights={light: 2}'": Run(
        "run", ("workload.duration_s=5", "workload.max_requests=100")),
    "servelab -m experiment=fcfs_vs_vtc": Run("sweep", ("workload.duration_s=8", "workload.max_requests=100"), jobs=2),
    "servelab-report sweeps/fcfs_vs_vtc": Run("report", needs="servelab -m experiment=fcfs_vs_vtc"),
    "servelab -m experiment=slo_vs_load": Run("sweep", ("workload.duration_s=5", "workload.rate_scale=1.4",
                                                                   "workload.max_requests=60"), jobs=4),
    "servelab-report sweeps/slo_vs_load": Run("report", needs="servelab -m experiment=slo_vs_load"),
    "benchmarks/gpu_tenants.sh": Excluded(NEEDS_CUDA),
    "benchmarks/gpu_peer.sh": Excluded(NEEDS_CUDA),
    "python benchmarks/engine_breakdown.py": Excluded(NEEDS_CUDA),
    "bash benchmarks/gpu_peer.sh --trace PATH --out DIR": Excluded(NEEDS_CUDA),
    "benchmarks/gpu_vllm_serve.sh": Excluded(NEEDS_CUDA),
    "servelab workload=shared_prefix num_kvcache_blocks=3000 cpu_cache_num_blocks=50000 cpu_cache_eviction=lru":
        Run("run", SHORT),
    "servelab workload=shared_prefix num_kvcache_blocks=3000 cpu_cache_gib=110": Run("run", SHORT),
    "servelab overlap_scheduling=true": Run("run", SHORT),
    "servelab -m experiment=cpu_tier workload.path=../shared/traces/conversation_trace.jsonl": Excluded(
        "a 2.5-minute sweep on the Mooncake trace; tests/experiments/test_cpu_tier_cli.py runs the tier and its plot"),
    "python -m experiments.tier_plot sweeps/cpu_tier": Excluded("needs the cpu_tier sweep above; "
                                                                  "tests/experiments/test_cpu_tier_cli.py runs it"),
    "pip install torch==2.13.0 -e '.[engine,serve]'": Excluded("an install; .ci/run installs the serve extra "
                                                               "through the test extra"),
    "servelab-serve backend.model_path=~/models/Qwen3-0.6B scheduler=srpt eviction=lfu serve.port=8000": Excluded(
        "starts a server that runs until stopped; tests/experiments/serve/test_shutdown.py runs it on a tiny "
        "checkpoint in its own process"),
    "python -m experiments.tiny_checkpoint ~/models/tiny": Excluded(
        "writes into the home folder; tests/experiments/test_tiny_checkpoint.py runs it into a temporary one"),
    "servelab-serve backend.model_path=~/models/tiny backend.device=cpu num_kvcache_blocks=256 max_model_len=256":
        Excluded("starts a server that runs until stopped; tests/experiments/serve/test_shutdown.py runs it on a "
                 "tiny checkpoint in its own process"),
    "pip install -e '.[http]'": Excluded("an install; .ci/run installs the test extra, which holds the http one's "
                                         "httpx and aiohttp"),
    "servelab backend=http backend.url=http://127.0.0.1:8000 model=qwen3_0p6b": Excluded(
        "needs a running OpenAI-compatible server; tests/experiments/test_http_vs_serve.py runs it against "
        "servelab-serve on a tiny checkpoint"),
    ("servelab backend=http backend.url=http://127.0.0.1:8000 model.vocab_size=512 max_model_len=256 "
     "workload.num_requests=8 workload/prompt_len=uniform workload.prompt_len.lo=4 workload.prompt_len.hi=30 "
     "workload/output_len=fixed workload.output_len.tokens=16"): Excluded(
        "needs the tiny server above, running; tests/experiments/test_http_vs_serve.py runs these overrides "
        "against servelab-serve on a tiny checkpoint"),
    "pip install -e '.[slurm]'": Excluded("an install; .ci/run installs the slurm extra"),
    "python -m experiments.validate --real-url URL": Excluded("needs a running server; "
                                                              "tests/experiments/test_http_backend.py runs it "
                                                              "against a stub"),
    "python benchmarks/loadgen.py --url URL --tokenizer DIR --out DIR": Excluded("needs a running server; "
                                                                       "tests/benchmarks/test_loadgen.py and "
                                                                       "tests/experiments/test_http_vs_serve.py "
                                                                       "run it"),
    "servelab-serve": Excluded("the server's name in prose; the full command above is the one shown"),
    "servelab-report": Excluded("the report's name in prose; the sweep commands above run it on a folder"),
    "tests/slurm/local_cluster.sh": Excluded("starts a SLURM cluster (root, slurm-wlm, munge); tests/slurm/conftest.py "
                                             "starts it for tests/slurm/test_slurm_sweep.py"),
    "bash benchmarks/slurm_sweep_time.sh": Excluded("a timing on a SLURM cluster it starts (root, slurm-wlm, munge); "
                                                    "tests/slurm/test_slurm_sweep.py checks the same sweep"),
}


def key_of(cmd: Shown) -> str:
    return f"python: {cmd.text.splitlines()[0]}" if cmd.kind == "python" else cmd.text


SHOWN = readme_commands(README.read_text())
BY_KEY = {key_of(c): c for c in SHOWN}
RUNNABLE = [k for k in BY_KEY if isinstance(COMMANDS.get(k), Run)]


def test_every_readme_command_is_in_the_table():
    missing = [k for k in BY_KEY if k not in COMMANDS]
    assert not missing, (f"README commands not in tests/test_readme.py COMMANDS (add each, with its shortening "
                         f"or the reason it cannot run here): {missing}")


def test_the_table_names_only_readme_commands():
    stale = [k for k in COMMANDS if k not in BY_KEY]
    assert not stale, f"COMMANDS entries the README no longer shows (remove or update them): {stale}"


def test_the_parser_finds_blocks_parts_and_inline_commands():
    text = ("intro `servelab a=1` and `requests.parquet`\n\n```bash\npip install x && servelab b=2   # note\n"
            "servelab -m c=1,2 \\\n    d=3\n```\n\n```python\nimport x\nprint(x)\n```\n"
            "see `python -m tool`\nand `bash\nrun.sh --out DIR`\n")
    assert readme_commands(text) == [Shown("pip install x", "shell"), Shown("servelab b=2", "shell"),
                                     Shown("servelab -m c=1,2 d=3", "shell"), Shown("import x\nprint(x)", "python"),
                                     Shown("servelab a=1", "shell"), Shown("python -m tool", "shell"),
                                     Shown("bash run.sh --out DIR", "shell")]


def test_servelab_scripts_are_the_modules_run_here():
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):\w+"', section, re.M))
    assert scripts == SCRIPTS


# -- the fresh-clone workspace ------------------------------------------------------------------------
def _repo_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files (what a clone of this working tree would hold)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        return [f for f in out.split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "outputs", "sweeps", "tmp", "multirun", "build", "__pycache__", ".hypothesis"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


# Commands that write under outputs/ run one after another (a run is told apart by the folder it adds);
# the others (sweeps, reports) run beside them, so that both cores work.
LANE = {"run": "outputs", "engine_run": "outputs", "python": "outputs", "sweep": "sweeps", "report": "sweeps"}


class Workspace:
    """The fresh-clone copy, and the README commands run in it (each once, in README order per lane)."""

    def __init__(self, root: Path, tmp: Path):
        self.root, self.tmp, self.ckpt = root, tmp, None     # root: the copy, cwd of every command
        self.lanes = {lane: ThreadPoolExecutor(1) for lane in set(LANE.values())}
        self.futures: dict[str, Future] = {}

    def start(self, keys) -> None:
        for key in keys:
            needs = COMMANDS[key].needs
            if needs and needs not in self.futures:
                self.start([needs])
            if key not in self.futures:
                self.futures[key] = self.lanes[LANE[COMMANDS[key].check]].submit(self._run, key)

    def result(self, key: str):
        """(argv, CompletedProcess, run folders the command added); re-raises its failure or skip."""
        self.start([key])
        return self.futures[key].result()

    def close(self) -> None:
        for pool in self.lanes.values():
            pool.shutdown(wait=True, cancel_futures=True)

    def checkpoint(self) -> Path:
        if self.ckpt is None:
            pytest.importorskip("torch")
            pytest.importorskip("transformers")
            from tests.engine.tiny_model import make_tiny_qwen3, make_tiny_tokenizer
            make_tiny_qwen3(self.tmp / "tiny_qwen3")
            make_tiny_tokenizer(self.tmp / "tiny_qwen3")
            self.ckpt = self.tmp / "tiny_qwen3"
        return self.ckpt

    def env(self) -> dict:
        env = dict(os.environ, PYTHONPATH=str(self.root), MPLBACKEND="Agg", HYDRA_FULL_ERROR="1")
        env.pop("SERVELAB_TRACES", None)
        return env

    def summaries(self, top: str) -> set[Path]:
        return {p.parent for p in (self.root / top).rglob("summary.json")}

    def _run(self, key: str):
        spec = COMMANDS[key]
        if spec.needs:
            self.futures[spec.needs].result()
        text = BY_KEY[key].text
        for name in re.findall(r"\.\./shared/traces/([\w.\-]+)", text):
            trace_file(name)
        uses_ckpt = "{ckpt}" in "".join(new for _, new in spec.replace) + "".join(spec.append)
        subs = {"ckpt": str(self.checkpoint())} if uses_ckpt else {}
        for old, new in spec.replace:
            assert old in text, f"{key!r}: the shortening replaces {old!r}, which the README command no longer holds"
            text = text.replace(old, new.format(**subs))
        if BY_KEY[key].kind == "python":
            argv = [sys.executable, "-c", text]
        else:
            words = shlex.split(text) + [a.format(**subs) for a in spec.append]
            argv = ([sys.executable, "-m", SCRIPTS[words[0]]] + words[1:] if words[0] in SCRIPTS
                    else [sys.executable] + words[1:] if words[0] == "python" else words)
        top = LANE[spec.check]
        before = self.summaries(top)
        res = subprocess.run(argv, cwd=self.root, env=self.env(), capture_output=True, text=True,
                             timeout=TIMEOUT_S)
        assert res.returncode == 0, (f"README command {key!r} failed as {argv[2:]} (exit {res.returncode}):\n"
                                     f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return argv, res, sorted(self.summaries(top) - before)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("clone")
    root = tmp / "servelab"
    for rel in _repo_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, root / rel)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (tmp / "shared").symlink_to(shared.resolve(), target_is_directory=True)
        assert (root / TRACES_REL).resolve() == TRACES.resolve()
    ws = Workspace(root, tmp)
    # start every selected command now, so that the two lanes overlap
    ws.start([item.callspec.params["key"] for item in request.session.items
              if item.module is request.module and "key" in getattr(getattr(item, "callspec", None), "params", {})])
    yield ws
    ws.close()


# -- what each command claims to write ----------------------------------------------------------------
def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _check_run_dir(run_dir: Path, num_requests: int) -> dict:
    for name in ("summary.json", "requests.parquet", "steps.parquet", "config.yaml"):
        assert (run_dir / name).is_file(), f"{run_dir} lacks {name}"
    assert list(run_dir.glob("*.png")), f"{run_dir} holds no PNG plot"
    s = _summary(run_dir)
    assert s["complete"] is True
    missing = [m for m in SUMMARY_METRICS if m not in s["metrics"]]
    assert not missing, f"summary.json lacks {missing}"
    assert s["metrics"]["num_requests"] == num_requests          # the shortening took effect
    assert len(pd.read_parquet(run_dir / "requests.parquet")) == num_requests
    assert len(pd.read_parquet(run_dir / "steps.parquet")) > 0
    return s


def _requested(spec: Run, argv=()) -> int:
    """The request count a run was shortened to, or else the one its command gives (workload.num_requests=N)."""
    given = [a for a in (*spec.append, *argv) if a.startswith(("workload.max_requests=", "workload.num_requests="))]
    return int(given[0].split("=")[1])


def check_run(ws, key, argv, res, new):
    assert len(new) == 1 and new[0].is_relative_to(ws.root / "outputs"), f"expected one new run under outputs/: {new}"
    _check_run_dir(new[0], _requested(COMMANDS[key]))
    if key == "servelab":
        assert "throughput" in res.stdout and "TTFT" in res.stdout, "servelab printed no summary"


def check_engine_run(ws, key, argv, res, new):
    check_run(ws, key, argv, res, new)
    assert _summary(new[0])["meta"]["backend"] == "engine"


def _sweep_dir(ws, argv) -> Path:
    name = next((a.split("=", 1)[1] for a in argv if a.startswith("name=")), None)
    if name is None:                                          # the experiment file names it
        exp = next(a.split("=", 1)[1] for a in argv if a.startswith("experiment="))
        name = re.search(r"^name:\s*(\S+)", (ws.root / "conf/experiment" / f"{exp}.yaml").read_text(), re.M)[1]
    return ws.root / "sweeps" / name


def check_sweep(ws, key, argv, res, new):
    sweep = _sweep_dir(ws, argv)
    jobs = sorted(d for d in new if d.parent == sweep)
    assert len(jobs) == len(new) == COMMANDS[key].jobs, f"expected {COMMANDS[key].jobs} new runs in {sweep}: {new}"
    for d in jobs:
        _check_run_dir(d, _requested(COMMANDS[key], argv))
    if key == SWEEP:
        # the point of the README's sweep: under KV pressure the policies differ
        ttft = {_summary(d)["metrics"]["ttft_s_p99"] for d in jobs}
        assert len(ttft) == len(jobs), f"the README sweep's policies give equal p99 TTFT: {ttft}"
        # re-launching resumes: every job is complete, so none runs again
        ids = {d: _summary(d)["run_id"] for d in jobs}
        again = subprocess.run(argv, cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=TIMEOUT_S)
        assert again.returncode == 0, again.stderr[-2000:]
        assert {d: _summary(d)["run_id"] for d in jobs} == ids, "a re-launched sweep ran finished jobs again"


def check_report(ws, key, argv, res, new):
    sweep = ws.root / shlex.split(BY_KEY[key].text)[1]
    runs = [d for d in sweep.iterdir() if (d / "summary.json").is_file()]
    table = pd.read_csv(sweep / "report" / "results.csv")
    assert len(table) == len(runs) >= 2
    policies = {str(p) for p in table["policy"]}
    assert len(policies) == len(runs) and all(p in res.stdout for p in policies), res.stdout   # the printed table
    assert (sweep / "report" / "overview.png").is_file()
    assert list((sweep / "report").glob("throughput_latency_*.png")), "no throughput/latency plots"
    diff = pd.read_csv(sweep / "report" / "differences.csv")             # every pair of policies at each rate
    assert set(diff["a"]) | set(diff["b"]) == policies and "differences between policy values" in res.stdout
    if key == "servelab-report sweeps/band_demo":
        # the README's numbers: a calibrated fit gives every comparison a band; vllm_swap vs vllm TTFT p50 is inside
        assert diff["band_known"].all() and (diff["verdict"] == "no difference").sum() == 2, diff
        row = diff[(diff["metric"] == "ttft_s_p50") & (diff["a"] == "vllm") & (diff["b"] == "vllm_swap")].iloc[0]
        assert row["verdict"] == "no difference" and abs(row["diff"]) < row["sim_band"]


def check_python(ws, key, argv, res, new):
    assert res.stdout.strip(), "the README's engine example printed nothing"


CHECKS = {"run": check_run, "engine_run": check_engine_run, "sweep": check_sweep, "report": check_report,
          "python": check_python}


@pytest.mark.slow
@pytest.mark.parametrize("key", RUNNABLE, ids=[re.sub(r"[^\w.=,-]+", "_", k)[:80] for k in RUNNABLE])
def test_readme_command_runs_and_writes_what_it_claims(workspace, key):
    argv, res, new = workspace.result(key)
    CHECKS[COMMANDS[key].check](workspace, key, argv, res, new)
