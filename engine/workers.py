"""Tensor parallelism across the GPUs of one host: the worker processes of ranks 1..tp-1.

One process per rank. Rank 0 is the LLM process: it runs the scheduler, prepares each step's
inputs on the host and sends them to ranks 1..tp-1 (the workers), then every rank runs the same
forward pass on its weight shards (the collectives are engine/collectives.py). Only rank 0 samples.

Step inputs travel over one multiprocessing pipe per worker, not over a collective: a worker
waits for the next step as long as the engine is idle, and a collective would hit the process
group's timeout during an idle spell, while a pipe read waits indefinitely and ends with EOFError
as soon as rank 0 is gone, so a worker never outlives its engine. The inputs are small host
arrays (token ids, positions, slots, block tables), pickled once per step.

Workers are spawned, so they import the main script again: a script that builds an LLM with
tensor_parallel_size > 1 outside `if __name__ == "__main__":` is refused before any worker starts.
The runner class travels to each worker as an argument (pickled by name), so this module never
imports engine/model_runner.py, which starts the workers.
"""
from __future__ import annotations

import ast
import os
import sys
import traceback
from datetime import timedelta
from multiprocessing.util import Finalize

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.collectives import destroy_group, disable_multicast, join_group

_READY, _ERROR, _EXIT = "ready", "error", "exit"


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and \
        any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)


def unguarded_main_line(path: str, line: int) -> bool:
    """True when line `line` of the script `path` lies outside every `if __name__ == "__main__":` block."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    return not any(isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= node.end_lineno
                   for node in ast.walk(tree))


def check_spawn_safe_main(size: int) -> None:
    """RuntimeError when the __main__ script reached this point from code that spawned workers would run again.

    A spawned worker imports the main script first (as __mp_main__); code outside the main guard runs
    again there, builds another LLM and stops the worker, while rank 0 would wait for it in the process
    group until distributed_timeout_s.
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not os.path.isfile(path):
        return                      # python -c, a REPL, a notebook: workers do not re-run it
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            break
        frame = frame.f_back
    if frame is None or not os.path.isfile(frame.f_code.co_filename):
        return
    try:
        unguarded = unguarded_main_line(frame.f_code.co_filename, frame.f_lineno)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return
    if unguarded:
        raise RuntimeError(f"tensor_parallel_size={size} starts worker processes with multiprocessing's spawn method, "
                           f"which imports {frame.f_code.co_filename} again in each worker; line {frame.f_lineno} "
                           "builds the LLM outside an `if __name__ == \"__main__\":` block, so every worker would "
                           "run it again. Move the script's code under `if __name__ == \"__main__\":`")


class Workers:
    """Ranks 1..tp-1 as spawned processes, and rank 0's end of the process group.

    start() spawns them and joins rank 0 to the group (a TCP store on a free local port);
    send() hands every worker the same message; close() stops them (also run at interpreter exit
    and when the owning runner is garbage collected, through a Finalize registered by the owner).
    """

    def __init__(self, procs, conns, store):
        self.procs, self.conns, self.store = procs, conns, store
        self.closed = False

    @classmethod
    def start(cls, config, hf_config: dict, device: torch.device, runner_cls) -> "Workers":
        if dist.is_initialized():
            raise RuntimeError("this process already has a torch.distributed process group (is another LLM with "
                               "tensor_parallel_size > 1 still open?); call close() on it first")
        size, timeout_s = config.tensor_parallel_size, config.distributed_timeout_s
        check_spawn_safe_main(size)
        disable_multicast()        # spawned workers inherit the environment
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        ctx = mp.get_context("spawn")
        procs, conns = [], []
        for rank in range(1, size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(rank, store.port, config, hf_config, child, runner_cls),
                            name=f"tp-worker-{rank}")
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        workers = cls(procs, conns, store)
        try:
            join_group(store, 0, size, device, timeout_s)
        except BaseException:
            workers.close()
            raise
        return workers

    def send(self, msg) -> None:
        for conn in self.conns:
            conn.send(msg)

    def wait_ready(self, timeout_s: float) -> None:
        """Returns once every worker has built its model; RuntimeError with a worker's traceback if one failed."""
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            if not conn.poll(timeout_s):
                raise RuntimeError(f"tensor-parallel rank {rank} did not start within distributed_timeout_s="
                                   f"{timeout_s} s (alive: {proc.is_alive()})")
            try:
                kind, detail = conn.recv()
            except EOFError:
                raise RuntimeError(f"tensor-parallel rank {rank} exited during start-up "
                                   f"(exit code {proc.exitcode})") from None
            if kind != _READY:
                raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{detail}")

    def failure(self) -> str | None:
        """A worker's error report, if one has sent it (non-blocking)."""
        for rank, conn in enumerate(self.conns, start=1):
            try:
                if conn.poll(0):
                    kind, detail = conn.recv()
                    if kind == _ERROR:
                        return f"rank {rank}: {detail}"
            except (EOFError, OSError):
                return f"rank {rank} exited"
        return None

    def close(self, join_timeout_s: float = 10.0) -> None:
        """Tells workers to exit, joins them (terminating stragglers), leaves the process group. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            try:
                conn.send((_EXIT,))
            except (OSError, ValueError):      # the worker is gone already
                pass
        for p in self.procs:
            p.join(join_timeout_s)
            if p.is_alive():
                p.terminate()
                p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for conn in self.conns:
            conn.close()
        destroy_group()


def register_shutdown(owner, workers: Workers) -> Finalize:
    """Runs workers.close() when `owner` is garbage collected or at interpreter exit, before
    multiprocessing joins its children (exitpriority >= 0), whichever comes first; calling the
    returned object closes now."""
    return Finalize(owner, workers.close, exitpriority=10)


def _worker_main(rank: int, port: int, config, hf_config: dict, conn, runner_cls) -> None:
    """Body of a worker process: join the group, build this rank's runner (runner_cls: the ModelRunner class),
    serve steps until told to exit."""

    disable_multicast()
    runner = None
    try:
        if not torch.cuda.is_available():       # CPU ranks share the cores instead of each taking all of them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
        store = dist.TCPStore("127.0.0.1", port, config.tensor_parallel_size, is_master=False,
                              timeout=timedelta(seconds=config.distributed_timeout_s))
        runner = runner_cls(config, hf_config, rank=rank, store=store)     # joins the group
        conn.send((_READY, None))
        while True:
            try:
                msg = conn.recv()
            except EOFError:            # rank 0 is gone
                break
            if msg[0] == _EXIT:
                break
            runner.serve(*msg[1:])
    except BaseException:
        try:
            conn.send((_ERROR, traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()
        destroy_group()
