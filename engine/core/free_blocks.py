"""The plain free list of the block manager: a FIFO of block ids with a bulk take (torch-free)."""
from __future__ import annotations

from itertools import islice


class FreeBlockQueue:
    """FIFO of plain free block ids: a deque's popleft/append/extend/len/iter, plus take(n), the n
    oldest ids as one list slice (a long prompt takes dozens of blocks at once)."""

    __slots__ = ("_ids", "_head")

    def __init__(self, ids=()):
        self._ids = list(ids)
        self._head = 0              # _ids[_head:] is the queue, oldest first

    def __len__(self) -> int:
        return len(self._ids) - self._head

    def __bool__(self) -> bool:
        return len(self._ids) > self._head

    def __iter__(self):
        return islice(self._ids, self._head, None)

    def __repr__(self) -> str:
        return f"FreeBlockQueue({list(self)})"

    def append(self, block_id: int) -> None:
        self._ids.append(block_id)

    def extend(self, block_ids) -> None:
        self._ids.extend(block_ids)

    def popleft(self) -> int:
        h = self._head
        if h >= len(self._ids):
            raise IndexError("popleft from an empty FreeBlockQueue")
        self._head = h + 1
        return self._ids[h]

    def take(self, n: int) -> list[int]:
        """Remove and return the n oldest ids (n <= len)."""
        ids, h = self._ids, self._head
        e = h + n
        if e > len(ids):
            raise IndexError(f"take({n}) from a FreeBlockQueue of {len(ids) - h}")
        out = ids[h:e]
        if e >= 1024 and 2 * e >= len(ids):
            del ids[:e]             # drop the consumed prefix once it is half the list (amortized O(1))
            e = 0
        self._head = e
        return out
