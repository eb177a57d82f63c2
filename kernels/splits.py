"""How many KV splits to run (``num_splits=0``) and how big the attention tiles are.

**Split ranges** are those of :func:`attn_ref.splits.split_bounds`: split ``s`` of ``n`` covers keys
``[s·ceil(s_k/n), (s+1)·ceil(s_k/n)) ∩ [0, s_k)``; the kernel computes them itself from ``s_k`` and
``n``.

**Heuristic** (:func:`choose_num_splits`). Without splitting the attention grid has
``programs = batch · h_k · m_blocks`` programs (pack-GQA: one program per KV head, not per query
head). Decode is memory bound: every SM should stream K/V, ideally with two resident programs each
to hide latency. So

* ``programs >= num_SMs``: one split (the grid already fills the device; splitting would only add
  the combine pass);
* otherwise ``n = ceil(2 · num_SMs / programs)``, capped so that each split still has at least
  :data:`MIN_BLOCKS_PER_SPLIT` key blocks (a split must amortise its Q load and its partial write)
  and by :data:`attn_ref.call.MAX_NUM_SPLITS` (256, FA3's limit).

The launcher passes static bounds only (:mod:`kernels.kvcache`): the query length ``sq`` (varlen:
``max_seqlen_q``) for ``m_blocks``, and the cache capacity for the key length, so the choice never
reads ``cache_seqlens`` and one CUDA graph serves every length.

Examples on an H200 (132 SMs), GQA 32/8, BLOCK_N 64: batch 1, 64k context -> 8 programs, ``n = 33``
(~2k keys each, 264 programs); batch 16, 4k -> 128 programs, ``n = 3``; batch 32 -> 256 programs,
``n = 1``. In the interpreter the device is taken to have :data:`kernels.launch.INTERPRETER_SMS`
SMs.

**Tiles** (:func:`attention_tiles`), chosen for H100/H200, no autotuning (the launch is
deterministic and the compile test compiles exactly what runs):

* decode-like calls (``max s_q · g <= 64`` packed rows): ``BLOCK_M = max(16, next_pow2(s_q ·
  g))``, ``BLOCK_N = 64``, 4 warps, 3 stages: a memory-bound stream of K/V blocks, split-KV for
  parallelism;
* prefill: ``BLOCK_M = 128`` packed rows, ``BLOCK_N = 64``, 8 warps, 3 stages (the Triton tutorial's
  Hopper shape for d = 128), causal blocks above the diagonal skipped;
* head dims above 128 halve ``BLOCK_N`` (and ``BLOCK_M`` for prefill) to stay within registers;
* ``BLOCK_M >= next_pow2(g)`` always, so a tile holds at least one row of all its heads;
* interpreter: ``BLOCK_M <= 64``, ``BLOCK_N = 32``: few, large programs (numpy cost is per
  operation, not per element), while multi-block key loops stay exercised on small test shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from attn_ref.call import MAX_NUM_SPLITS

from .launch import INTERPRETING, next_power_of_2

#: Fewest key blocks a split should hold when the heuristic splits.
MIN_BLOCKS_PER_SPLIT = 4


@triton.jit
def split_bounds(seqlen_k, split, num_splits):
    """``(k0, k1)`` int32: the keys ``[k0, k1)`` of split ``split`` of ``num_splits`` over ``[0,
    seqlen_k)`` (entry ``split`` of :func:`attn_ref.splits.split_bounds`)."""
    length = tl.cdiv(seqlen_k, num_splits)
    k0 = tl.minimum(split * length, seqlen_k)
    return k0, tl.minimum(k0 + length, seqlen_k)


@dataclass(frozen=True)
class AttentionTiles:
    block_m: int  # packed (row, head) entries per tile
    block_n: int  # keys per block
    num_warps: int
    num_stages: int


def attention_tiles(group: int, max_seqlen_q: int, head_dim: int,
                    head_dim_v: int) -> AttentionTiles:
    """Tile sizes for ``group = h / h_k`` query heads per KV head (see the module docstring)."""
    packed_rows = max(1, max_seqlen_q) * group
    min_m = max(16, next_power_of_2(group))
    wide = max(head_dim, head_dim_v) > 128
    if INTERPRETING:
        return AttentionTiles(max(min_m, min(64, next_power_of_2(packed_rows))), 32, 4, 1)
    if packed_rows <= 64:
        return AttentionTiles(max(min_m, next_power_of_2(packed_rows)), 32 if wide else 64, 4, 3)
    if wide:
        return AttentionTiles(max(min_m, 64), 32, 4, 2)
    return AttentionTiles(max(min_m, 128), 64, 8, 3)


def choose_num_splits(programs: int, max_seqlen_k: int, block_n: int, num_sms: int) -> int:
    """Split count for ``num_splits=0``: ``programs`` = unsplit grid size (see the module
    docstring)."""
    if programs >= num_sms:
        return 1
    by_occupancy = triton.cdiv(2 * num_sms, max(programs, 1))
    by_length = triton.cdiv(max_seqlen_k, block_n) // MIN_BLOCKS_PER_SPLIT
    return max(1, min(by_occupancy, by_length, MAX_NUM_SPLITS))
