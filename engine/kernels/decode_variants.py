"""Launch parameters of the paged decode kernel (`DecodeVariant`), the table that picks one per batch size, and
the candidates benchmarks/decode_tune.py times.

A variant is a set of tile sizes, launch options and code paths of engine/kernels/paged_decode.py's kernels;
`DecodeVariant()` is the kernel as measured before the variants existed (64-key tiles, 4 warps, 3 stages for
one split and 2 otherwise, one program per (sequence, kv head), `choose_num_splits`). The engine picks a
variant per decode batch from its card's table in DECODE_TABLES_BY_CARD, else from DECODE_TABLE (the batch size is
fixed per captured CUDA graph, so is the variant). To adopt a sweep's result for a card, add the table of the
DECODE_TABLE line decode_tune.py prints under the card's name in DECODE_TABLES_BY_CARD.

Torch-free: the sweep, the tests and the table read it without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DecodeVariant:
    """One configuration of the paged decode kernels.

    block_n: keys per tile (a power of two >= 16; may span several KV pages).
    num_warps, num_stages: Triton launch options; num_stages None: 3 for one split, 2 otherwise.
    kv_heads_per_program: kv heads one program handles (1, 2, 4, ...): their query heads are the rows of one
        tile and the tile's keys are (token, kv head) pairs, so a program reads kv_heads_per_program * 256
        contiguous bytes per token (head_dim 128, bf16) and the grid has that many times fewer programs.
        Falls back to 1 for a model whose kv head count it does not divide.
    use_dot: scores and P@V on tensor cores (tl.dot, query rows padded to 16), else as broadcast
        multiply-adds over exactly next_pow2(GROUP) rows (no padding; kv_heads_per_program must be 1).
    mask_tail_only: the steady-state loop over whole tiles loads without masks; one masked tile at the end.
    heads_fastest: grid (kv head programs, sequences, splits) instead of (sequences, kv head programs, splits),
        so the programs running at once read the heads of the same pages rather than one head of many pages.
    num_splits: key splits per sequence; None: `choose_num_splits` (one for batches with >= 2 programs per SM).
    min_partition: least keys per split (rounded up to block_n); with a fixed num_splits and a large
        min_partition only long contexts split.
    direct_single: with several splits, a sequence whose keys fit in one split writes its output directly and
        the reduce pass skips it (no float32 partial output round trip).
    """
    block_n: int = 64
    num_warps: int = 4
    num_stages: int | None = None
    kv_heads_per_program: int = 1
    use_dot: bool = True
    mask_tail_only: bool = False
    heads_fastest: bool = False
    longest_first: bool = False
    num_splits: int | None = None
    min_partition: int = 256
    direct_single: bool = False

    def __post_init__(self):
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeVariant.block_n must be a power of two >= 16, got {self.block_n}")
        if self.kv_heads_per_program < 1 or self.kv_heads_per_program & (self.kv_heads_per_program - 1):
            raise ValueError(f"DecodeVariant.kv_heads_per_program must be a power of two >= 1, "
                             f"got {self.kv_heads_per_program}")
        if not self.use_dot and self.kv_heads_per_program != 1:
            raise ValueError("DecodeVariant.use_dot=False needs kv_heads_per_program=1")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"DecodeVariant.num_splits must be None or >= 1, got {self.num_splits}")
        if self.min_partition < 1:
            raise ValueError(f"DecodeVariant.min_partition must be >= 1, got {self.min_partition}")

    @property
    def name(self) -> str:
        """Short stable name from the fields that differ from the default ('default' for none)."""
        short = dict(block_n="n", num_warps="w", num_stages="s", kv_heads_per_program="h", use_dot="dot",
                     mask_tail_only="tail", heads_fastest="hfast", longest_first="lpt", num_splits="splits",
                     min_partition="minp", direct_single="direct")
        base = DecodeVariant()
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(base, f.name):
                continue
            if isinstance(value, bool):
                parts.append(short[f.name] if value else f"no{short[f.name]}")
            else:
                parts.append(f"{short[f.name]}{value}")
        return "_".join(parts) or "default"

    def literal(self) -> str:
        """Python source that rebuilds this variant (the fields that differ from the default)."""
        base = DecodeVariant()
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                         if getattr(self, f.name) != getattr(base, f.name))
        return f"DecodeVariant({args})"


# (largest batch size of the bucket or None for any larger batch, variant), in increasing batch size.
DECODE_TABLE: tuple[tuple[int | None, DecodeVariant], ...] = ((None, DecodeVariant()),)

# A card's own table (a part of torch's device name -> table), where a sweep on that card measured one.
DECODE_TABLES_BY_CARD: dict[str, tuple[tuple[int | None, DecodeVariant], ...]] = {
    # benchmarks/results/engine_speed/h100_1207/decode_tune_h100.json: per bucket 0.91, 0.94, 0.97, 1, 0.98, 0.96,
    # 1 of the default's time; nano-vllm's benchmark: decode steps 0.2% and 1.2% shorter (docs/engine_speed.md)
    "H100": ((4, DecodeVariant(block_n=128, num_warps=8, num_stages=2)), (16, DecodeVariant(block_n=128, num_stages=2)),
             (32, DecodeVariant()), (64, DecodeVariant(num_splits=4, min_partition=512, direct_single=True)),
             (128, DecodeVariant(heads_fastest=True, longest_first=True)), (None, DecodeVariant())),
}


def table_for_device(device_name: str | None):
    """The table of the card torch names device_name ("NVIDIA H100 80GB HBM3"), else DECODE_TABLE."""
    for card, table in DECODE_TABLES_BY_CARD.items():
        if device_name and card in device_name:
            return table
    return DECODE_TABLE


def variant_for_batch(num_seqs: int, table=None, device_name: str | None = None) -> DecodeVariant:
    """The variant of the first bucket whose bound is >= num_seqs (None bounds everything) in `table`, by default
    the table of the card named device_name."""
    for bound, variant in (table_for_device(device_name) if table is None else table):
        if bound is None or num_seqs <= bound:
            return variant
    return DecodeVariant()


def install(table) -> None:
    """Use `table` on every card in this process (benchmarks that time one table against another)."""
    global DECODE_TABLE, DECODE_TABLES_BY_CARD
    DECODE_TABLE, DECODE_TABLES_BY_CARD = tuple(table), {}


def install_line(line: str) -> None:
    """install() the table of a DECODE_TABLE line (table_literal's, which benchmarks/decode_tune.py prints)."""
    ns = {"DecodeVariant": DecodeVariant}
    exec(line, ns)
    install(ns["DECODE_TABLE"])


def table_literal(table) -> str:
    """The DECODE_TABLE line that installs `table` ((bound, variant), ...)."""
    cells = ", ".join(f"({bound!r}, {variant.literal()})" for bound, variant in table)
    return f"DECODE_TABLE: tuple[tuple[int | None, DecodeVariant], ...] = ({cells},)"


# What benchmarks/decode_tune.py times and tests/engine/test_decode_variants.py checks: every code path of the
# kernels (tile sizes, warps, stages, heads per program, the multiply-add path, unmasked steady state, grid
# order, longest first, splits for big batches), the default first.
CANDIDATES: tuple[DecodeVariant, ...] = (
    DecodeVariant(),
    DecodeVariant(num_stages=2),
    DecodeVariant(num_stages=4),
    DecodeVariant(num_warps=8),
    DecodeVariant(block_n=32, num_stages=3),
    DecodeVariant(block_n=32, num_warps=2, num_stages=3),
    DecodeVariant(block_n=128, num_stages=2),
    DecodeVariant(block_n=128, num_warps=8, num_stages=2),
    DecodeVariant(mask_tail_only=True),
    DecodeVariant(heads_fastest=True),
    DecodeVariant(mask_tail_only=True, heads_fastest=True),
    DecodeVariant(kv_heads_per_program=2),
    DecodeVariant(kv_heads_per_program=2, block_n=32),
    DecodeVariant(kv_heads_per_program=2, num_warps=8),
    DecodeVariant(kv_heads_per_program=2, mask_tail_only=True, heads_fastest=True),
    DecodeVariant(kv_heads_per_program=4, block_n=32),
    DecodeVariant(kv_heads_per_program=8, block_n=16),
    DecodeVariant(use_dot=False, block_n=32),
    DecodeVariant(use_dot=False, block_n=16, num_warps=2),
    DecodeVariant(direct_single=True),
    DecodeVariant(num_splits=2, min_partition=1024, direct_single=True),
    DecodeVariant(num_splits=4, min_partition=1024, direct_single=True),
    DecodeVariant(num_splits=4, min_partition=512, direct_single=True),
    DecodeVariant(num_splits=4, min_partition=512, direct_single=True, num_stages=3),
    DecodeVariant(num_splits=8, min_partition=256, direct_single=True, num_stages=3),
    DecodeVariant(longest_first=True),
    DecodeVariant(longest_first=True, heads_fastest=True),
    DecodeVariant(longest_first=True, heads_fastest=True, num_splits=4, min_partition=512, direct_single=True,
                  num_stages=3),
)
