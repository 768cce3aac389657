"""Real replays kept on disk, so the simulator side of a validation re-runs without the GPU.

A validation with `--real-dir DIR` writes, next to its report, what the real side produced:

    DIR/<name>_<policy>_requests.parquet, DIR/<name>_<policy>_steps.parquet   one pair per policy
    DIR/<name>_<policy>_decisions.parquet     the scheduler's decisions per step (--record-decisions)
    DIR/<name>_real.json      engine facts: EngineRunConfig, KV and swap blocks, vocab size, device,
                              load and warm-up seconds, each policy's run info, the validate
                              command's arguments (`argv`: experiments.generalize re-makes the
                              simulated side from them)
    DIR/config.json           the checkpoint's config (the roofline model's dimensions)

`python -m experiments.validate --from-real DIR --name NAME` then loads those runs instead of
replaying, and simulates against them: the same report, the real side measured once on the GPU,
the simulated side recomputed (for example after refitting a cost model). The saved command's
workload and scheduler flags are the defaults there (saved_argv; flags given after them win), so
the workload need not be spelled again.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from experiments.results import write_json, write_parquet
from experiments.runner_engine import EngineRunConfig, RunResult, scheduler_config

# validate flags that belong to the engine side (dropped on re-make), with whether they take a value.
ENGINE_FLAGS = {"--model": True, "--device": True, "--real-dir": True, "--out-dir": True, "--steps-out": True,
                "--max-wall-s": True, "--repeats": True, "--profile": True, "--threads": True, "--name": True,
                "--record-decisions": False, "--no-roofline": False, "--no-plot": False, "--save-tables": False,
                "--enforce-eager": False, "--attention-backend": True}


def workload_argv(saved_argv: list[str], traces_dir: str | None) -> list[str]:
    """The stored validate argv without the engine-side flags; --trace re-rooted at traces_dir."""
    out, i = [], 0
    while i < len(saved_argv):
        a = saved_argv[i]
        flag = a.split("=", 1)[0]
        if flag in ENGINE_FLAGS:
            i += 1 + (ENGINE_FLAGS[flag] and "=" not in a)
            continue
        if flag == "--trace" and traces_dir:
            path = a.split("=", 1)[1] if "=" in a else saved_argv[i + 1]
            out += ["--trace", str(Path(traces_dir) / Path(path).name)]
            i += 1 if "=" in a else 2
            continue
        out.append(a)
        i += 1
    return out


def saved_argv(real_dir, name: str, traces_dir: str | None = None) -> list[str]:
    """The workload and scheduler flags of the validate command that kept `name`'s runs in real_dir
    (workload_argv of its recorded argv), [] when none is recorded or the record is missing."""
    path = Path(real_dir) / f"{name}_real.json"
    if not path.is_file():
        return []
    argv = json.loads(path.read_text()).get("argv")
    return workload_argv(argv, traces_dir) if argv else []


def _paths(real_dir: Path, name: str, policy: str) -> tuple[Path, Path]:
    return real_dir / f"{name}_{policy}_requests.parquet", real_dir / f"{name}_{policy}_steps.parquet"


def _decisions_path(real_dir: Path, name: str, policy: str) -> Path:
    return real_dir / f"{name}_{policy}_decisions.parquet"


def save_real_run(real_dir, name: str, policy: str, run: RunResult) -> None:
    requests, steps = _paths(Path(real_dir), name, policy)
    write_parquet(run.requests, requests)
    write_parquet(run.steps, steps)
    if run.decisions is not None:
        write_parquet(run.decisions, _decisions_path(Path(real_dir), name, policy))


def save_real_meta(real_dir, name: str, replayer, device: str, runner_device: str, load_s: float,
                   warm_s: float, infos: dict, argv: list[str] | None = None) -> None:
    """Engine facts of a live replayer (experiments.runner_engine.EngineReplayer) and its runs' info."""
    real_dir = Path(real_dir)
    real_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(replayer.config.model_path) / "config.json", real_dir / "config.json")
    write_json(real_dir / f"{name}_real.json", {
        "engine": asdict(replayer.config), "device": device, "runner_device": runner_device,
        "engine_load_s": load_s, "warmup_s": warm_s,
        "vocab_size": replayer.vocab_size, "max_model_len": replayer.max_model_len,
        "num_kvcache_blocks": replayer.num_kvcache_blocks, "num_cpu_blocks": replayer.num_cpu_blocks,
        "cpu_cache_num_blocks": getattr(replayer, "cpu_cache_num_blocks", replayer.config.cpu_cache_num_blocks),
        "runs": infos, "argv": list(argv) if argv is not None else None})


class SavedReplays:
    """Stands in for EngineReplayer: `replay` returns the run saved for that policy."""

    def __init__(self, real_dir, name: str):
        self.real_dir = Path(real_dir)
        meta_path = self.real_dir / f"{name}_real.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"--from-real {real_dir}: no {meta_path.name}; run the validation with "
                                    f"--real-dir {real_dir} --name {name} on the GPU first (or fix --name)")
        self.name = name
        self.meta = json.loads(meta_path.read_text())
        self.config = EngineRunConfig(**self.meta["engine"])
        self.vocab_size = self.meta["vocab_size"]
        self.max_model_len = self.meta["max_model_len"]
        self.num_kvcache_blocks = self.meta["num_kvcache_blocks"]
        self.num_cpu_blocks = self.meta["num_cpu_blocks"]
        # the tier the runner allocated (resolved from cpu_cache_gib when sized in GiB; older records: the config's)
        self.cpu_cache_num_blocks = self.meta.get("cpu_cache_num_blocks", self.config.cpu_cache_num_blocks)
        self.device = self.meta["device"]
        self.model_dir = self.real_dir            # holds config.json

    def scheduler_config(self, num_kvcache_blocks: int | None = None, num_cpu_blocks: int | None = None,
                         cpu_cache_num_blocks: int | None = None):
        kv = self.num_kvcache_blocks if num_kvcache_blocks is None else int(num_kvcache_blocks)
        cpu = self.num_cpu_blocks if num_cpu_blocks is None else int(num_cpu_blocks)
        tier = self.cpu_cache_num_blocks if cpu_cache_num_blocks is None else int(cpu_cache_num_blocks)
        return scheduler_config(kv, cpu, self.config, self.max_model_len, tier)

    @property
    def policies(self) -> list[str]:
        return list(self.meta["runs"])

    @property
    def saved_policies(self) -> list[str]:
        """The policies with a saved run on disk (their requests table), in the order the record lists them."""
        return [p for p in self.policies if _paths(self.real_dir, self.name, p)[0].is_file()]

    def check_policies(self, policies: list[str]) -> None:
        """ValueError naming the policies without a saved run and those that have one (before any work)."""
        saved = self.saved_policies
        missing = [p for p in policies if p not in saved]
        if missing:
            raise ValueError(f"--policies {','.join(missing)}: no saved real run in {self.real_dir} (--name "
                             f"{self.name}); it holds {', '.join(saved) or 'none'}: give --policies "
                             f"{','.join(saved) or '...'}, or replay the others on the GPU with --real-dir")

    def check_workload(self, specs, policy: str) -> None:
        """ValueError, before any work, unless specs (the workload the flags give) are the requests of the kept
        `policy` run: the same ids with the same prompt lengths."""
        kept = pd.read_parquet(_paths(self.real_dir, self.name, policy)[0], columns=["request_id", "num_prompt_tokens"])
        kept = dict(zip(kept["request_id"].astype(str), kept["num_prompt_tokens"].astype(int)))
        here = {str(s.request_id): int(s.num_prompt_tokens) for s in specs}
        if here == kept:
            return
        other = sorted(set(here) ^ set(kept)) or sorted(r for r in here if here[r] != kept[r])
        raise ValueError(f"--from-real {self.real_dir}: the workload the flags give ({len(here)} requests) is not the "
                         f"kept {policy} run's ({len(kept)}; request {other[0]} differs): drop the workload flags "
                         f"given here (the kept command's are the defaults), or give the kept command's")

    def run(self, policy: str) -> RunResult:
        """The saved run of `policy`, as it was recorded."""
        req_path, steps_path = _paths(self.real_dir, self.name, policy)
        if not req_path.is_file():
            raise FileNotFoundError(f"no saved real run for policy {policy!r} in {self.real_dir} ({req_path.name})")
        dec_path = _decisions_path(self.real_dir, self.name, policy)
        return RunResult(pd.read_parquet(req_path), pd.read_parquet(steps_path),
                         dict(self.meta["runs"].get(policy, {})),
                         pd.read_parquet(dec_path) if dec_path.is_file() else None)

    def replay(self, requests, policy: str = "vllm", **_) -> RunResult:
        run = self.run(policy)
        wanted = {r.request_id for r in requests}
        saved = set(run.requests["request_id"])
        if wanted != saved:
            raise ValueError(f"the saved {policy} run holds {len(saved)} requests, the workload {len(wanted)} "
                             f"({len(wanted - saved)} not in the saved run): give the same workload flags as "
                             f"the GPU run (its command is in the report)")
        return run
