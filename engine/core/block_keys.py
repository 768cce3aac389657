"""The prefix cache's key of a full KV block: what names its content (torch-free).

Three kinds, all ints, chained (a block's key stands for its tokens and every token before):

    content hash   hash_block: h_i = xxh64(h_{i-1} || token ids of block i), >= 0. Any tokens
                   (the engine). A hit also compares the block's tokens, so a hash collision
                   never serves wrong KV.
    prefix chain   -4 - 2 * (c * KEY_STRIDE + i), even: block i of a sequence whose tokens up to
                   the end of the block are named by chain id c (`Sequence.prefix_chain`: the
                   simulator's prefix-hash blocks, one id per distinct run of leading hash ids).
    private        base - 2 * i, odd (base = private_key_base(n)): block i of the n-th sequence
                   whose private blocks got keys (`Sequence.private_from`: blocks no other
                   sequence can hold).

Negative keys are exact: equal keys, equal content, no token check. -1 and -2 are never keys
(the block manager's "no hash" and "dead" marks).
"""
from __future__ import annotations

import sys

import numpy as np
import xxhash

from engine.core.sequence import Sequence

KEY_STRIDE = 1 << 40        # more blocks than any sequence has


def hash_block(token_ids, parent_hash: int) -> int:
    """Chained 64-bit content hash of one full block (parent -1 for the first block)."""
    h = xxhash.xxh64()
    if parent_hash != -1:
        h.update(parent_hash.to_bytes(8, "little"))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.intdigest()


def private_key_base(n: int) -> int:
    """Block 0's key for the n-th (n >= 1) sequence whose private blocks get keys (odd, < -2)."""
    return -3 - 2 * n * KEY_STRIDE


def first_private_block(seq: Sequence, block_size: int) -> int:
    """Index of seq's first private block (sys.maxsize if none)."""
    p = seq.private_from
    return sys.maxsize if p is None else p // block_size


def extend_block_keys(seq: Sequence, num_full_blocks: int, block_size: int, hash_fn=hash_block) -> list[int]:
    """Extend seq.block_hashes to the keys of its first num_full_blocks full blocks: prefix-chain
    keys or content hashes before the first private block, private keys from it on (which only a
    sequence with a private_key asks for)."""
    keys = seq.block_hashes
    bs = block_size
    start = len(keys)
    end = min(num_full_blocks, first_private_block(seq, bs))
    if start < end and seq.prefix_chain is not None:
        b, ids = seq.prefix_chain      # the prefix block holding the block's last token names the chain
        keys += [-4 - 2 * (ids[((i + 1) * bs - 1) // b] * KEY_STRIDE + i) for i in range(start, end)]
    elif start < end:
        tokens = seq.token_ids
        for i in range(start, end):
            keys.append(hash_fn(tokens[i * bs:(i + 1) * bs], keys[-1] if keys else -1))
    if num_full_blocks > len(keys):
        assert seq.private_key, "private blocks get keys when first published"
        base = seq.private_key
        keys += [base - 2 * i for i in range(len(keys), num_full_blocks)]
    return keys
