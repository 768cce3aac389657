"""One Unix stream socket between the HTTP server and its engine process, carrying whole messages both ways.

    ch = Channel(sock)               # a connected AF_UNIX SOCK_STREAM socket; made non-blocking
    ch.send(data)                    # a whole frame, blocking until the kernel has it (reading meanwhile)
    if not ch.send_nowait(data):     # the event loop's side: what did not fit stays buffered ...
        loop.add_writer(ch.fileno(), lambda: ch.flush() and loop.remove_writer(ch.fileno()))
    ch.poll(timeout_ms)              # whether a message waits (0: look, no wait)
    data = ch.recv()                 # the next message's bytes, or None
    ch.fill(); data = ch.take()      # one read of the socket, then the messages it brought (no second read)
    ch.closed                        # the other end closed it (or it failed); what came before is still read

A frame is a 4-byte big-endian length and that many bytes (a pickle). ZeroMQ, which the two processes used
before, hands every message to an I/O thread of its own in each process, which reads the IPC socket and then
wakes the thread waiting in poll through a mailbox: two wake-ups a hop, and on a host with few cores two more
threads wanting one. Here the receiving thread reads the socket itself (benchmarks/wakeup_latency.py times
both). Messages sent with send_nowait are buffered without limit, as the ZeroMQ sockets did (SNDHWM 0): the
event loop writes the rest when the socket is writable, the engine process at its next poll, so neither
waits for the other to read. A blocking send (the last messages, and the server's before its loop runs)
keeps reading into the inbox while it waits: two processes sending to each other at once never wait on
each other.
"""
from __future__ import annotations

import select
import socket
import struct
import time
from collections import deque

HEADER = struct.Struct("!I")        # a frame's length, bytes
READ_BYTES = 1 << 20                # one recv's most


class Channel:
    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self.closed = False
        self.lost = False                   # a write failed (the other end gone): queued bytes were dropped
        self._in = bytearray()
        self._frames: deque = deque()
        self._out = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    # -- reading ------------------------------------------------------------------------------------
    def fill(self) -> None:
        """Reads what the socket holds, without waiting, and cuts the complete frames off."""
        buf = self._in
        while not self.closed:
            try:
                chunk = self.sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:                 # reset: the other process died
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            buf += chunk
            if len(chunk) < READ_BYTES:
                break
        pos, end = 0, len(buf)
        while end - pos >= HEADER.size:
            n = HEADER.unpack_from(buf, pos)[0]
            if end - pos - HEADER.size < n:
                break
            self._frames.append(bytes(buf[pos + HEADER.size:pos + HEADER.size + n]))
            pos += HEADER.size + n
        if pos:
            del buf[:pos]

    def poll(self, timeout_ms: float) -> bool:
        """Whether a message waits, after up to timeout_ms for one (0: only look). What send_nowait left
        queued goes out meanwhile, as the socket takes it."""
        if self._out:
            self.flush()
        if not self._frames:
            self.fill()
        deadline_s = time.monotonic() + timeout_ms / 1000
        while not self._frames and not self.closed:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                break
            readable, writable, _ = select.select([self.sock], [self.sock] if self._out else [], [], left_s)
            if writable:
                self.flush()
            if readable:
                self.fill()
        return bool(self._frames)

    def recv(self) -> bytes | None:
        """The next whole message, or None when none has come in full."""
        if not self._frames:
            self.fill()
        return self.take()

    def take(self) -> bytes | None:
        """The next whole message already read (by fill, poll or recv), or None; never reads the socket. A
        reader woken by the socket reads it once (fill) and then takes: looping on recv() costs one more read,
        a system call that finds the socket empty, before the messages' work (a first token's) goes on."""
        return self._frames.popleft() if self._frames else None

    # -- writing ------------------------------------------------------------------------------------
    def send_nowait(self, data: bytes) -> bool:
        """Queues a message and writes what the socket takes now; False when some is left for flush()."""
        self._out += HEADER.pack(len(data))
        self._out += data
        return self.flush()

    def flush(self) -> bool:
        """Writes what the socket takes now of what is queued; True once nothing is left."""
        out = self._out
        while out:
            try:
                n = self.sock.send(out)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:                 # the other process is gone: nobody will read it
                self.closed = self.lost = True
                out.clear()
                return True
            del out[:n]
        return True

    def send(self, data: bytes, timeout_s: float | None = None) -> None:
        """Queues a message and waits until the socket has taken everything queued, reading what comes in
        meanwhile (the other side may itself be sending and not reading). TimeoutError after timeout_s;
        BrokenPipeError (an OSError) when the other end is gone."""
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        if self.send_nowait(data):
            if self.lost:
                raise BrokenPipeError("the other process closed the channel")
            return
        while not self.flush():
            left_s = None if deadline_s is None else deadline_s - time.monotonic()
            if left_s is not None and left_s <= 0:
                raise TimeoutError(f"the other process took no message for {timeout_s} s")
            readable, _, _ = select.select([self.sock], [self.sock], [], left_s)
            if readable:
                self.fill()
            if self.closed:
                raise BrokenPipeError("the other process closed the channel")
        if self.lost:
            raise BrokenPipeError("the other process closed the channel")

    def close(self) -> None:
        self.closed = True
        self.sock.close()
