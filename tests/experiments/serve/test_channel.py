"""experiments/serve/channel.py: whole messages both ways over one Unix socket. A message larger than the
socket's buffer arrives whole; two processes sending to each other at once never deadlock (a blocking send
reads meanwhile); a non-blocking send keeps what did not fit, in order, and the next polls write it; what was
sent before the other end closed is still read, and then `closed` says so."""
from __future__ import annotations

import socket
import threading

from experiments.serve.channel import Channel


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Channel(a), Channel(b)


def _drain(ch, count: int, out: list) -> None:
    while len(out) < count:
        if ch.poll(5000):
            out.append(ch.recv())


def test_a_message_larger_than_the_socket_buffer_arrives_whole():
    a, b = _pair()
    big = bytes(range(256)) * 20_000            # 5 MB, many times a Unix socket's buffer
    got: list = []
    reader = threading.Thread(target=_drain, args=(b, 2, got))
    reader.start()
    a.send(big, timeout_s=30)
    a.send(b"after", timeout_s=30)
    reader.join(30)
    assert got == [big, b"after"]


def test_both_sides_sending_at_once_do_not_deadlock():
    a, b = _pair()
    big = b"x" * 4_000_000
    results: dict = {}

    def side(name, ch):
        ch.send(big, timeout_s=30)              # the other side is sending too, not reading
        got: list = []
        _drain(ch, 1, got)
        results[name] = got

    threads = [threading.Thread(target=side, args=(n, ch)) for n, ch in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"a": [big], "b": [big]}


def test_a_nonblocking_send_keeps_what_did_not_fit_in_order():
    a, b = _pair()
    big = b"y" * 3_000_000
    assert not a.send_nowait(big)               # the socket takes part of it
    assert not a.send_nowait(b"second")         # queued behind, not written ahead of the rest
    got: list = []
    while len(got) < 2:
        a.flush()
        b.fill()
        while (m := b.recv()) is not None:
            got.append(m)
    assert got == [big, b"second"] and a.flush()


def test_what_came_before_the_other_end_closed_is_read_then_closed_says_so():
    a, b = _pair()
    a.send(b"last words")
    a.close()
    assert b.poll(1000) and b.recv() == b"last words"
    assert b.recv() is None and b.closed
    assert not b.poll(1000)                     # no waiting on a closed channel


def test_polls_send_what_a_nonblocking_send_left():
    # the engine process queues its step messages (send_nowait) and never waits for a slow server: its polls
    # between steps write the rest as the socket takes it
    a, b = _pair()
    big = b"z" * 3_000_000
    assert not a.send_nowait(big)
    got: list = []
    reader = threading.Thread(target=_drain, args=(b, 1, got))
    reader.start()
    for _ in range(2000):
        if not a._out:
            break
        a.poll(50)
    reader.join(30)
    assert not a._out and got == [big]


class _CountingSocket:
    """A socket whose recv calls are counted (socket.socket's own methods cannot be patched)."""

    def __init__(self, sock):
        self.sock, self.reads = sock, 0

    def setblocking(self, flag):
        self.sock.setblocking(flag)

    def fileno(self):
        return self.sock.fileno()

    def recv(self, n):
        self.reads += 1
        return self.sock.recv(n)


def test_a_woken_reader_reads_the_socket_once_per_wake_up():
    # the server's loop and the engine process read what woke them with one system call: a second read that
    # finds the socket empty sat on every first token's path, before the message's work went on
    a_sock, b_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a, counted = Channel(a_sock), _CountingSocket(b_sock)
    b = Channel(counted)
    a.send(b"one")
    a.send(b"two")
    b.fill()
    got = []
    while (m := b.take()) is not None:
        got.append(m)
    assert got == [b"one", b"two"] and counted.reads == 1
    assert b.take() is None and counted.reads == 1          # take never reads
    a.send(b"three")
    assert b.poll(1000) and counted.reads == 2 and b.take() == b"three" and counted.reads == 2


def test_the_engine_loop_and_the_server_read_once_per_message():
    import asyncio
    import pickle

    from experiments.serve.engine_client import ProcessEngine
    from experiments.serve.engine_process import EngineCore

    a_sock, b_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a, counted = Channel(a_sock), _CountingSocket(b_sock)
    core = EngineCore(None, Channel(counted), None, 0)
    a.send(pickle.dumps(("stop",)))
    core._drain(1000)
    assert core._stopping and counted.reads == 1

    a_sock, b_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a, counted = Channel(a_sock), _CountingSocket(b_sock)
    engine = ProcessEngine()
    engine._ch = Channel(counted)

    async def main():
        engine._loop = asyncio.get_running_loop()
        fut = engine._probes[3] = engine._loop.create_future()
        a.send(pickle.dumps(("probe", 3, {"live": 0})))
        engine._on_readable()           # the socket is readable: the loop calls this
        return fut.result()

    assert asyncio.run(main()) == {"live": 0} and counted.reads == 1
