"""One message's trip from one process to another, by transport and by how the receiver waits.

    python benchmarks/wakeup_latency.py                        # ~40 s; --messages 300 --gap-ms 30 --payload-bytes 4000
    python benchmarks/wakeup_latency.py --out wakeup.json

The serving path's ZeroMQ hops (server -> engine process -> server, experiments/serve/engine_client.py and
engine_process.py) cost 40-70 us on a loaded 2-core CPU box and 340-415 us on an idle H200 host
(benchmarks/results/serve/serve_hops.json): there, every hop wakes a sleeping thread twice, ZeroMQ's I/O thread
(which reads the IPC socket) and then the thread blocked in poll (woken through ZeroMQ's mailbox). This times one
message, sent --gap-ms after the last one (the receiver has gone idle), from a parent process to a spawned child,
for each pair of:
  transport  zmq: a PUSH/PULL pair over IPC (what servelab-serve uses); unix: a plain Unix stream socket
             (length-prefixed frames, no I/O thread in between)
  receiver   block: poll with a timeout (the kernel wakes it); spin: a zero-timeout poll / non-blocking read in a
             loop with os.sched_yield() (the receiver is awake when the message lands; serve.spin_window_ms)
The time is the child's read less the parent's stamp before its send (time.perf_counter, CLOCK_MONOTONIC: one
clock for every process of the host). Prints each pair's p50 / p90 in microseconds; --out writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

HEADER = struct.Struct("!I")        # a frame's length, bytes


def _recv_exact(sock, n: int, spin: bool) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf), socket.MSG_DONTWAIT if spin else 0)
        except BlockingIOError:
            os.sched_yield()
            continue
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def child(transport: str, mode: str, addr: str, count: int, result_q) -> None:
    spin = mode == "spin"
    times = []
    if transport == "zmq":
        import zmq
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.connect(addr)
        result_q.put("ready")
        for _ in range(count):
            if spin:
                while not pull.poll(0):
                    os.sched_yield()
            else:
                pull.poll(-1)
            t = time.perf_counter()
            msg = pickle.loads(pull.recv(zmq.NOBLOCK))
            times.append(t - msg[0])
        pull.close(linger=0)
        ctx.term()
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(addr)
        result_q.put("ready")
        for _ in range(count):
            head = _recv_exact(sock, HEADER.size, spin)
            t = time.perf_counter()
            msg = pickle.loads(_recv_exact(sock, HEADER.unpack(head)[0], spin))
            times.append(t - msg[0])
        sock.close()
    result_q.put(times)


def one_pair(transport: str, mode: str, args) -> list[float]:
    work = tempfile.mkdtemp(prefix="wakeup_")
    path = os.path.join(work, "sock")
    q = mp.get_context("spawn").Queue()
    payload = list(range(args.payload_bytes // 4))      # ~4 bytes an int when pickled: a prompt's token ids
    if transport == "zmq":
        import zmq
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.bind(f"ipc://{path}")
        addr = f"ipc://{path}"
    else:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        addr = path
    proc = mp.get_context("spawn").Process(target=child, args=(transport, mode, addr, args.messages + args.warmup, q))
    proc.start()
    if transport == "unix":
        conn, _ = srv.accept()
    assert q.get(timeout=60) == "ready"
    time.sleep(0.2)
    for _ in range(args.messages + args.warmup):
        time.sleep(args.gap_ms / 1000)
        if transport == "zmq":
            push.send(pickle.dumps((time.perf_counter(), payload), protocol=5))
        else:
            t = time.perf_counter()
            body = pickle.dumps((t, payload), protocol=5)
            conn.sendall(HEADER.pack(len(body)) + body)
    times = q.get(timeout=120)[args.warmup:]
    proc.join(30)
    if transport == "zmq":
        push.close(linger=0)
        ctx.term()
    else:
        conn.close()
        srv.close()
    os.unlink(path) if os.path.exists(path) else None
    os.rmdir(work)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--gap-ms", type=float, default=30.0, help="pause before each message (the receiver idles)")
    ap.add_argument("--payload-bytes", type=int, default=4000, help="about a 1,000-token prompt's ids, pickled")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    out = {"settings": {k: getattr(args, k) for k in ("messages", "gap_ms", "payload_bytes")}, "one_way_us": {}}
    print(f"{args.messages} messages, {args.gap_ms:g} ms apart, ~{args.payload_bytes} bytes; one way, microseconds:")
    for transport in ("zmq", "unix"):
        for mode in ("block", "spin"):
            times = sorted(t * 1e6 for t in one_pair(transport, mode, args))
            p50, p90 = statistics.median(times), times[int(0.9 * (len(times) - 1))]
            out["one_way_us"][f"{transport}_{mode}"] = {"p50": p50, "p90": p90}
            print(f"  {transport:5s} {mode:6s} p50 {p50:7.1f}  p90 {p90:7.1f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
