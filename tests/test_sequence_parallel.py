"""Sequence parallelism in one process: layouts, the ring schedule, world size 1, argument checks.

Everything here runs without ``torch.distributed``: a group of one rank is the identity. The
multi-rank behaviour is in :mod:`test_sequence_parallel_ranks` and :mod:`test_sp_backward`, both
parametrised over the two implementations (reference and Triton kernels).
"""

from __future__ import annotations

import re

import pytest
import torch

import attn_ref
from attn_ref import sequence_parallel as sp
from attn_ref.sequence_parallel import ring

D = 16


def _qkv(b=2, s=8, h=4, hkv=2, d=D, dtype=torch.float32):
    gen = torch.Generator().manual_seed(s * 100 + h * 10 + hkv)
    return tuple(torch.randn(b, s, n, d, generator=gen).to(dtype) for n in (h, hkv, hkv))


def _reference(q, k, v, causal=False):
    out, lse = attn_ref.flash_attn_with_kvcache(q, k, v, causal=causal, return_softmax_lse=True)[:2]
    return out, lse.transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------


def test_zigzag_positions_pair_early_and_late_chunks():
    assert sp.shard_positions(8, 0, 1, 2, zigzag=True).tolist() == [0, 1, 6, 7]
    assert sp.shard_positions(8, 1, 1, 2, zigzag=True).tolist() == [2, 3, 4, 5]
    # USP 2x2: ring block g = chunks g and 3-g of 4, split between the two Ulysses ranks.
    assert [sp.shard_positions(16, p, 2, 2, zigzag=True).tolist() for p in range(4)] == [
        [0, 1, 2, 3],
        [12, 13, 14, 15],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]


def test_contiguous_positions_follow_sp_rank():
    assert [sp.shard_positions(8, p, 2, 2).tolist() for p in range(4)] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]


@pytest.mark.parametrize(
    "u, r, zigzag", [(1, 1, False), (4, 1, False), (1, 4, True), (2, 2, True), (2, 2, False)]
)
def test_shard_then_unshard_is_identity(u, r, zigzag):
    x = torch.randn(2, 32, 3, 4)
    shards = [sp.shard_sequence(x, p, u, r, zigzag) for p in range(u * r)]
    assert torch.equal(sp.unshard_sequence(shards, u, r, zigzag), x)


@pytest.mark.parametrize(
    "args, exc, message",
    [
        (
            (10, 0, 4, 1, False),
            ValueError,
            "sequence length (10) must be divisible by the world size (4)",
        ),
        (
            (12, 0, 2, 2, True),
            ValueError,
            "sequence length (12) must be divisible by 2 x ring_degree x ulysses_degree (8) for "
            "the zigzag layout",
        ),
        ((8, 4, 2, 2, False), ValueError, "sp_rank must be an int in [0, 4), got 4"),
        ((8, 0, 0, 2, False), ValueError, "ulysses_degree must be >= 1, got 0"),
        ((8, 0, 1, 2.0, False), TypeError, "ring_degree must be an int, got float"),
    ],
)
def test_shard_argument_errors(args, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        sp.shard_positions(*args)


# --------------------------------------------------------------------------------------------------
# The ring schedule
# --------------------------------------------------------------------------------------------------


def _step_work(rank: int, step: int, size: int, rows: int, zigzag: bool) -> float:
    """Score entries rank ``rank`` computes at ``step`` of a causal ring (a causal square counts
    half)."""
    src = (rank - step) % size
    blocks = ring._blocks(
        ring.block_chunks(rank, size, rows, zigzag),
        ring.block_chunks(src, size, rows, zigzag),
        True,
    )
    return sum(
        (b.q_rows.stop - b.q_rows.start)
        * (b.k_rows.stop - b.k_rows.start)
        * (0.5 if b.causal else 1.0)
        for b in blocks
    )


def test_zigzag_balances_the_causal_ring():
    size, rows = 4, 8
    for step in range(1, size):  # after the diagonal step, every rank does half a block
        assert {_step_work(r, step, size, rows, zigzag=True) for r in range(size)} == {
            rows * rows / 2
        }
    totals = [
        sum(_step_work(r, t, size, rows, zigzag=False) for t in range(size)) for r in range(size)
    ]
    # contiguous: rank r does r + 1/2 blocks
    assert totals == [rows * rows * (r + 0.5) for r in range(size)]


def test_ring_blocks_merge_into_one_call_without_causal():
    chunks = ring.block_chunks(1, 4, 8, zigzag=True)
    assert ring._blocks(chunks, ring.block_chunks(2, 4, 8, zigzag=True), causal=False) == [
        ring._Block(slice(0, 8), slice(0, 8), False)
    ]


def test_zigzag_step_from_a_later_rank_uses_the_second_half_of_the_queries():
    # rank 0 holds chunks 0 and 3, rank 1 holds 1 and 2: both of rank 1's chunks precede chunk 3
    # only.
    blocks = ring._blocks(
        ring.block_chunks(0, 2, 8, True), ring.block_chunks(1, 2, 8, True), causal=True
    )
    assert blocks == [ring._Block(slice(4, 8), slice(0, 8), False)]


def test_rows_that_see_no_key_give_zero_and_minus_inf_not_nan():
    q, k, v = _qkv(s=4)
    before_everything = (ring.Chunk(slice(0, 4), ring.PREFIX_POSITION),)
    out, lse = ring.ring_attention_states(
        q,
        k,
        v,
        before_everything,
        lambda src: ring.block_chunks(src, 1, 4, False),
        group=None,
        backend=sp.REFERENCE_BACKEND,
        softmax_scale=D**-0.5,
        causal=True,
    )
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("-inf")).all())


# --------------------------------------------------------------------------------------------------
# World size 1: no torch.distributed, every scheme is local attention
# --------------------------------------------------------------------------------------------------


def test_collectives_are_the_identity_on_one_rank():
    x = torch.randn(2, 5, 3, 4)
    assert sp.all_to_all_4d(x, 2, 1) is x
    assert sp.all_to_all_4d(x, 0, 3) is x  # as upstream: world size 1 returns before any check
    assert sp.all_gather(x, dim=7) is x
    assert sp.SequenceParallelGroups.from_world() == sp.SequenceParallelGroups.single()
    assert sp.init_sequence_parallel_groups(1, 1) == sp.SequenceParallelGroups.single()


@pytest.mark.parametrize("causal", [False, True])
def test_single_rank_schemes_equal_local_attention(causal):
    q, k, v = _qkv()
    rq, rk, rv = _qkv(s=3)
    out_ref, lse_ref = _reference(
        torch.cat([q, rq], 1), torch.cat([k, rk], 1), torch.cat([v, rv], 1), causal
    )
    modes = ["ulysses", "auto"] + ([] if causal else ["kv_gather"])
    for mode in modes:
        out, rep, lse, rep_lse = sp.UlyssesAttention(
            4, D, 2, causal=causal, sp_attention_mode=mode
        )(q, k, v, rq, rk, rv, return_softmax_lse=True)
        torch.testing.assert_close(torch.cat([out, rep], 1), out_ref)
        torch.testing.assert_close(torch.cat([lse, rep_lse], 1), lse_ref)
    out, lse = sp.USPAttention(4, D, 2, causal=causal)(
        torch.cat([q, rq], 1),
        torch.cat([k, rk], 1),
        torch.cat([v, rv], 1),
        num_replicated_suffix=3,
        return_softmax_lse=True,
    )
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(lse, lse_ref)
    out, lse = sp.ring_attention(q, k, v, causal=causal, zigzag=True)
    torch.testing.assert_close((out, lse), _reference(q, k, v, causal))


# --------------------------------------------------------------------------------------------------
# Argument checks (the same code runs on every rank; the multi-rank tests check them there too)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(num_heads=4.0, head_size=D), TypeError, "num_heads must be an int, got float"),
        (dict(num_heads=0, head_size=D), ValueError, "num_heads must be >= 1, got 0"),
        (
            dict(num_heads=4, head_size=D, num_kv_heads=3),
            ValueError,
            "Query heads (4) must be divisible by KV heads (3).",
        ),
        (
            dict(num_heads=4, head_size=D, softmax_scale=-1.0),
            ValueError,
            "softmax_scale must be a finite number > 0 or None, got -1.0",
        ),
        (
            dict(num_heads=4, head_size=D, softmax_scale="1"),
            TypeError,
            "softmax_scale must be a float or None, got str",
        ),
        (
            dict(num_heads=4, head_size=D, sp_attention_mode="ring"),
            ValueError,
            "sp_attention_mode must be one of ('ulysses', 'kv_gather', 'auto'), got 'ring'",
        ),
        (
            dict(num_heads=4, head_size=D, causal=True, sp_attention_mode="kv_gather"),
            ValueError,
            "K/V-gather SP does not support causal attention.",
        ),
    ],
)
def test_ulysses_constructor_errors(kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        sp.UlyssesAttention(**kwargs)


def test_usp_constructor_checks_heads():
    with pytest.raises(
        ValueError, match=re.escape("Query heads (6) must be divisible by KV heads (4).")
    ):
        sp.USPAttention(6, D, 4)


def _ulysses_call(mode="ulysses", **overrides):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    args.update(overrides)
    return lambda: sp.UlyssesAttention(4, D, 2, sp_attention_mode=mode)(**args)


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (_ulysses_call(q="q"), TypeError, "q must be a torch.Tensor, got str"),
        (
            _ulysses_call(q=torch.randn(8, 4, D), replicated_q=torch.randn(1)),
            ValueError,
            "Expected 4D tensors",
        ),
        # upstream order in the gather path: varlen before the replicated check
        (
            _ulysses_call("kv_gather", replicated_k=torch.randn(2, 3, 2, D), seq_lens=[8]),
            NotImplementedError,
            "K/V-gather SP does not support varlen UlyssesAttention.",
        ),
        (
            _ulysses_call("kv_gather", replicated_v=torch.randn(2, 3, 2, D)),
            ValueError,
            "Replicated Q, K, and V must be provided together.",
        ),
        # the Ulysses path raises it too (sglang ignores a lone replicated_k there)
        (
            _ulysses_call(replicated_k=torch.randn(2, 3, 2, D)),
            ValueError,
            "Replicated Q, K, and V must be provided together.",
        ),
        (
            _ulysses_call(replicated_q=torch.randn(2, 3, 4, D), seq_lens=[8]),
            ValueError,
            "Varlen Ulysses attention does not support replicated QKV",
        ),
        (
            _ulysses_call(k=torch.randn(2, 8, 2, D, dtype=torch.float16)),
            ValueError,
            "q, k and v must have the same dtype, got torch.float32, torch.float16, torch.float32",
        ),
        (
            _ulysses_call(
                q=torch.ones(2, 8, 4, D).long(),
                k=torch.ones(2, 8, 2, D).long(),
                v=torch.ones(2, 8, 2, D).long(),
            ),
            ValueError,
            "q, k and v must be float16, bfloat16 or float32, got torch.int64",
        ),
        (
            _ulysses_call(k=torch.randn(3, 8, 2, D)),
            ValueError,
            "q, k and v must have the same batch size (dim 0), got 2, 3, 2",
        ),
        (
            _ulysses_call(v=torch.randn(2, 8, 3, D)),
            ValueError,
            "k and v must have the same number of heads, dividing q's (dim 2): q 4, k 2, v 3",
        ),
        (
            _ulysses_call(k=torch.randn(2, 8, 2, 8)),
            ValueError,
            "q and k must have the same head_dim (dim 3), got 16 and 8",
        ),
        (
            _ulysses_call(k=torch.randn(2, 8, 4, D), v=torch.randn(2, 8, 4, D)),
            ValueError,
            "q must have num_heads=4 and k, v num_kv_heads=2 heads (dim 2), got q 4 and k 4",
        ),
        (
            _ulysses_call(
                q=torch.randn(2, 8, 4, 8), k=torch.randn(2, 8, 2, 8), v=torch.randn(2, 8, 2, 8)
            ),
            ValueError,
            "q and k must have head_size=16 (dim 3), got 8",
        ),
        (
            _ulysses_call(
                replicated_q=torch.randn(2, 3, 4, D),
                replicated_k=torch.randn(2, 3, 4, D),
                replicated_v=torch.randn(2, 3, 2, D),
            ),
            ValueError,
            "replicated_k must be [batch, S_r, heads, head_dim] = [2, S_r, 2, 16] like k, got (2, "
            "3, 4, 16)",
        ),
        (
            _ulysses_call(
                replicated_q=torch.randn(2, 3, 4, D),
                replicated_k=torch.randn(2, 3, 2, D).half(),
                replicated_v=torch.randn(2, 3, 2, D),
            ),
            ValueError,
            "replicated_k must have the dtype and device of k (torch.float32, cpu), got "
            "torch.float16, cpu",
        ),
        (
            _ulysses_call(
                replicated_q=torch.randn(2, 3, 4, D),
                replicated_k=torch.randn(2, 2, 2, D),
                replicated_v=torch.randn(2, 3, 2, D),
            ),
            ValueError,
            "replicated_q, replicated_k and replicated_v must have the same sequence length (dim "
            "1), got 3, 2, 3",
        ),
    ],
)
def test_ulysses_forward_errors(call, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        call()


@pytest.mark.parametrize("seq_lens", ["8", [-1], [3, 5]])
def test_one_rank_ignores_seq_lens_as_upstream(seq_lens):
    # sglang's varlen all-to-all returns its input on one rank before any check: the call is local
    # attention.
    q, k, v = _qkv()
    out, _ = sp.UlyssesAttention(4, D, 2)(q, k, v, seq_lens=seq_lens)
    torch.testing.assert_close(out, _reference(q, k, v)[0])


def _usp_call(counts, q_rows=8, kv_rows=8):
    q, _, _ = _qkv(s=q_rows)
    _, k, v = _qkv(s=kv_rows)
    return lambda: sp.USPAttention(4, D, 2)(q, k, v, **counts)


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (
            _usp_call(dict(attn_mask=torch.ones(2, 8, dtype=torch.bool))),
            NotImplementedError,
            "attn_mask is not supported by this USPAttention",
        ),
    ],
)
def test_usp_forward_errors(call, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        call()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "counts",
    [
        dict(num_replicated_prefix=True),
        dict(num_replicated_suffix=-2),
        dict(num_replicated_prefix=8),
        dict(num_replicated_prefix=2, num_replicated_kv_prefix=2),
        dict(num_replicated_kv_prefix=3),
    ],
)
def test_one_rank_usp_is_local_attention_whatever_the_counts_as_upstream(counts, causal):
    # sglang: one rank (or skip_sequence_parallel) calls the local attention before reading the
    # counts.
    q, _, _ = _qkv(s=8)
    _, k, v = _qkv(s=10)
    out = sp.USPAttention(4, D, 2, causal=causal)(q, k, v, **counts)
    torch.testing.assert_close(out, _reference(q, k, v, causal)[0])


def test_groups_need_torch_distributed_for_more_than_one_rank():
    with pytest.raises(
        ValueError, match=re.escape("ulysses_degree x ring_degree = 2 x 1 needs torch.distributed")
    ):
        sp.init_sequence_parallel_groups(2, 1)
    with pytest.raises(TypeError, match=re.escape("ring_degree must be an int, got str")):
        sp.init_sequence_parallel_groups(None, "2")


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, "gloo", 10.0), "world_size must be >= 1, got 0"),
        ((0, None, 10.0), "world_size must be >= 1, got 0"),
        ((2, "mpi", 10.0), "backend must be 'gloo' or 'nccl', got 'mpi'"),
        ((2, "gloo", 0), "timeout_s must be a number of seconds > 0, got 0"),
    ],
)
def test_launch_argument_errors(args, message):
    world_size, backend, timeout_s = args
    with pytest.raises(ValueError, match=re.escape(message)):
        sp.launch(print, world_size, backend=backend, timeout_s=timeout_s)


def test_launch_checks_world_size_before_choosing_a_backend():
    with pytest.raises(TypeError, match=re.escape("world_size must be an int, got str")):
        sp.launch(print, "2")


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="a machine with 64 GPUs can run this")
def test_launch_nccl_needs_a_device_per_rank():
    with pytest.raises(
        ValueError, match=re.escape("backend 'nccl' needs one CUDA device per rank: world_size=64")
    ):
        sp.launch(print, 64, backend="nccl")
