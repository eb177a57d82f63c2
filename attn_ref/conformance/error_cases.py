"""The error contract of ``flash_attn_with_kvcache`` as data: calls that must fail, and how.

Each case changes a few arguments of :func:`base` (a valid call that appends new k/v, so a check
that ran after the append would leave a trace in the caches) and names the exception type and exact
message (or a compiled pattern). ``UPSTREAM_ORDER`` pins sglang's five ValueErrors (and its two
stride checks, which sglang asserts and this package raises as ValueErrors), SGL-B's ``ver`` check
before them, and what their order implies (``v_cache`` missing wins over every other error; without
``q`` and ``k_cache`` the ``k_cache`` message comes first). ``PACKAGE_CHECKS`` are this package's
own, extra checks; ``UPSTREAM_REJECTS`` names those whose calls upstream rejects too (a C++
``TORCH_CHECK``), which any conforming implementation must refuse without touching its caches.

The tables build their tensors with the default device, so ``with torch.device(...)`` builds a case
on another device; :func:`base` makes its values on the CPU from a fixed seed and moves them there.
"""

from __future__ import annotations

import re

import torch

I32 = torch.int32


def base() -> dict:
    """Valid call: b=2, sq=2, h=4, h_k=2, d=dv=16, capacity 8, appends 2 tokens at [3, 5)."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cpu").to(torch.get_default_device())

    return dict(
        q=randn(2, 2, 4, 16),
        k_cache=randn(2, 8, 2, 16),
        v_cache=randn(2, 8, 2, 16),
        k=randn(2, 2, 2, 16),
        v=randn(2, 2, 2, 16),
        cache_seqlens=torch.tensor([3, 5], dtype=I32),
    )


def _v_inside_k(args):
    """MLA-like layout: v_cache is the first 16 channels of a 32-channel buffer that is also
    k_cache."""
    shared = torch.randn(2, 8, 2, 32)
    return dict(
        args,
        q=torch.randn(2, 2, 4, 32),
        k=torch.randn(2, 2, 2, 32),
        k_cache=shared,
        v_cache=shared[..., :16],
    )


def strided(*shape):
    """A tensor whose last dimension has stride 2."""
    return torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]


def paged(args, page_size=2, pages=(7, 1, 4, 0, 2, 6, 3, 5), extra=0):
    """The base call on a paged cache of 4 pages per sequence (+ ``extra`` spare pages)."""
    table = torch.tensor(pages, dtype=I32).view(2, 4)
    n = len(pages) + extra
    return dict(
        args,
        page_table=table,
        k_cache=torch.randn(n, page_size, 2, 16),
        v_cache=torch.randn(n, page_size, 2, 16),
    )


def rotary(args, rows=16, dim=16):
    return dict(args, rotary_cos=torch.ones(rows, dim // 2), rotary_sin=torch.zeros(rows, dim // 2))


def varlen(args, cu=(0, 1, 4)):
    return dict(
        args, q=torch.randn(cu[-1], 4, 16), cu_seqlens_q=torch.tensor(cu, dtype=I32), max_seqlen_q=3
    )


def fp8(args):
    return {
        key: val.to(torch.float8_e4m3fn)
        if isinstance(val, torch.Tensor) and val.is_floating_point()
        else val
        for key, val in args.items()
    }


def drop(args, *names):
    return {key: val for key, val in args.items() if key not in names}


UPSTREAM_ORDER = {
    "ver_wins_over_everything": (
        lambda a: dict(a, ver=4, v_cache=None, k_cache=None, q=None, softcap=None),
        ValueError,
        "sgl_kernel.flash_attn only supports ver=3, got 4",
    ),
    "ver_repr": (
        lambda a: dict(a, ver="3"),
        ValueError,
        "sgl_kernel.flash_attn only supports ver=3, got '3'",
    ),
    "v_cache_none_wins": (
        lambda a: dict(a, v_cache=None, k_cache=None, q=None, k=[1], page_table="bad"),
        ValueError,
        "v_cache must be provided",
    ),
    "v_cache_stride": (
        lambda a: dict(a, v_cache=strided(2, 8, 2, 16), k_cache=None),
        ValueError,
        "v_cache must have contiguous last dimension",
    ),
    "k_cache_none_before_q_none": (
        lambda a: dict(a, k_cache=None, q=None),
        ValueError,
        "k_cache can only be None when only_qv=True",
    ),
    "k_cache_stride": (
        lambda a: dict(a, k_cache=strided(2, 8, 2, 16), q=None),
        ValueError,
        "k_cache must have contiguous last dimension",
    ),
    "q_none_without_only_qv": (
        lambda a: dict(a, q=None, qv=torch.randn(2, 2, 4, 16)),
        ValueError,
        "q can only be None when only_qv=True",
    ),
    "q_none_qv_none_with_placeholder_k_cache": (
        lambda a: dict(a, q=None, k_cache=None, only_qv=True),
        ValueError,
        "q must be provided unless qv is provided with only_qv=True",
    ),
    "q_none_qv_none": (
        lambda a: dict(a, q=None, only_qv=True),
        ValueError,
        "q must be provided unless qv is provided with only_qv=True",
    ),
    "only_qv_without_qv_default_scale": (
        lambda a: dict(a, only_qv=True),
        ValueError,
        "only_qv=True requires qv to be provided",
    ),
    "upstream_checks_before_package_checks": (
        lambda a: dict(
            a, q=None, k=a["k"].half(), page_table=torch.zeros(2, 2), softcap=-1.0, num_splits=999
        ),
        ValueError,
        "q can only be None when only_qv=True",
    ),
}

PACKAGE_CHECKS = {
    # --- wrong Python types
    "v_cache_not_tensor": (
        lambda a: dict(a, v_cache="cache"),
        TypeError,
        "v_cache must be a torch.Tensor, got str",
    ),
    "q_not_tensor": (lambda a: dict(a, q=[[1.0]]), TypeError, "q must be a torch.Tensor, got list"),
    "sinks_not_tensor": (
        lambda a: dict(a, sinks=[0.0] * 4),
        TypeError,
        "sinks must be a torch.Tensor, got list",
    ),
    # --- only_qv with an explicit scale
    "only_qv_without_qv_explicit_scale": (
        lambda a: dict(a, only_qv=True, softmax_scale=0.25),
        ValueError,
        "only_qv=True computes the scores from qv alone, so qv must be given (softmax_scale was "
        "given, so sglang's default-scale check did not run)",
    ),
    # --- dtypes
    "q_dtype": (
        lambda a: dict(a, q=a["q"].double()),
        ValueError,
        "q must have dtype float16, bfloat16, float32 or float8_e4m3fn, got torch.float64",
    ),
    "k_cache_dtype": (
        lambda a: dict(a, k_cache=a["k_cache"].half()),
        ValueError,
        "k_cache must have dtype torch.float32, got torch.float16",
    ),
    "k_dtype": (
        lambda a: dict(a, k=a["k"].bfloat16()),
        ValueError,
        "k must have dtype torch.float32, got torch.bfloat16",
    ),
    "page_table_dtype": (
        lambda a: dict(paged(a), page_table=paged(a)["page_table"].long()),
        ValueError,
        "page_table must have dtype torch.int32, got torch.int64",
    ),
    "cache_seqlens_dtype": (
        lambda a: dict(a, cache_seqlens=torch.tensor([3, 5])),
        ValueError,
        "cache_seqlens must have dtype torch.int32, got torch.int64",
    ),
    "cu_seqlens_q_dtype": (
        lambda a: dict(varlen(a), cu_seqlens_q=torch.tensor([0, 1, 4])),
        ValueError,
        "cu_seqlens_q must have dtype torch.int32, got torch.int64",
    ),
    "qv_dtype": (
        lambda a: dict(a, qv=torch.randn(2, 2, 4, 16).half()),
        ValueError,
        "qv must have dtype torch.float32, got torch.float16",
    ),
    "out_dtype": (
        lambda a: dict(a, out=torch.empty(2, 2, 4, 16).half()),
        ValueError,
        "out must have dtype torch.float32, got torch.float16",
    ),
    "out_dtype_fp8_is_bf16": (
        lambda a: dict(fp8(a), out=torch.empty(2, 2, 4, 16, dtype=torch.float8_e4m3fn)),
        ValueError,
        "out must have dtype torch.bfloat16, got torch.float8_e4m3fn",
    ),
    "descale_dtype": (
        lambda a: dict(fp8(a), k_descale=torch.ones(2, 2, dtype=torch.float64)),
        ValueError,
        "k_descale must have dtype torch.float32, got torch.float64",
    ),
    "rotary_cos_not_float": (
        lambda a: dict(rotary(a), rotary_cos=torch.ones(16, 8, dtype=I32)),
        ValueError,
        "rotary_cos must have a floating-point dtype, got torch.int32",
    ),
    "sinks_not_float": (
        lambda a: dict(a, sinks=torch.zeros(4, dtype=I32)),
        ValueError,
        "sinks must have a floating-point dtype, got torch.int32",
    ),
    "qv_with_fp8": (
        lambda a: dict(fp8(a), qv=torch.randn(2, 2, 4, 16).to(torch.float8_e4m3fn)),
        ValueError,
        "qv is not supported with float8_e4m3fn inputs",
    ),
    # --- devices
    "device": (
        lambda a: dict(a, k_cache=a["k_cache"].to("meta"), v_cache=a["v_cache"].to("meta")),
        ValueError,
        "k_cache must be on the same device as q (cpu), got meta",
    ),
    # --- ranks and shapes
    "q_ndim": (
        lambda a: dict(a, q=a["q"][0]),
        ValueError,
        "q must be 4-D (batch, seqlen_q, h, d), got shape (2, 4, 16)",
    ),
    "q_ndim_varlen": (
        lambda a: dict(varlen(a), q=a["q"]),
        ValueError,
        "q must be 3-D (total_q, h, d) when cu_seqlens_q is given, got shape (2, 2, 4, 16)",
    ),
    "k_cache_ndim": (
        lambda a: dict(a, k_cache=a["k_cache"][0], v_cache=a["v_cache"][0]),
        ValueError,
        "k_cache must be 4-D (batch_cache, seqlen_cache, h_k, dim) or (num_pages, P, h_k, dim), "
        "got shape (8, 2, 16)",
    ),
    "k_ndim": (
        lambda a: dict(a, k=a["k"][0]),
        ValueError,
        "k must be 4-D (batch, seqlen_new, h_k, dim), got shape (2, 2, 16)",
    ),
    "k_ndim_varlen": (
        lambda a: dict(a, cu_seqlens_k_new=torch.tensor([0, 1, 2], dtype=I32)),
        ValueError,
        "k must be 3-D (total_k_new, h_k, dim) when cu_seqlens_k_new is given, got "
        "shape (2, 2, 2, 16)",
    ),
    "page_table_ndim": (
        lambda a: dict(paged(a), page_table=paged(a)["page_table"].flatten()),
        ValueError,
        "page_table must be 2-D (batch_k, max_pages_per_seq), got shape (8,)",
    ),
    "cu_seqlens_q_ndim": (
        lambda a: dict(varlen(a), cu_seqlens_q=torch.tensor([[0, 1, 4]], dtype=I32)),
        ValueError,
        "cu_seqlens_q must be 1-D (batch + 1,) offsets, got shape (1, 3)",
    ),
    "rotary_cos_ndim": (
        lambda a: dict(a, rotary_cos=torch.ones(16), rotary_sin=torch.ones(16)),
        ValueError,
        "rotary_cos must be 2-D (seqlen_rotary, rotary_dim / 2), got shape (16,)",
    ),
    "k_cache_head_dim": (
        lambda a: dict(a, k_cache=torch.randn(2, 8, 2, 32)),
        ValueError,
        "k_cache must have shape (2, 8, 2, 16) (matching v_cache, with q's head "
        "dim), got (2, 8, 2, 32)",
    ),
    "v_shape": (
        lambda a: dict(a, v=torch.randn(2, 2, 2, 8)),
        ValueError,
        "v must have shape (2, 2, 2, 16) (batch, seqlen_new, h_k, dim), got (2, 2, 2, 8)",
    ),
    "k_heads": (
        lambda a: dict(a, k=torch.randn(2, 2, 1, 16)),
        ValueError,
        "k must have shape (2, 2, 2, 16) (batch, seqlen_new, h_k, dim), got (2, 2, 1, 16)",
    ),
    "cache_seqlens_shape": (
        lambda a: dict(a, cache_seqlens=torch.tensor([3, 5, 1], dtype=I32)),
        ValueError,
        "cache_seqlens must have shape (2,) (batch,), got (3,)",
    ),
    "cache_leftpad_shape": (
        lambda a: dict(a, cache_leftpad=torch.tensor([0], dtype=I32)),
        ValueError,
        "cache_leftpad must have shape (2,) (batch,), got (1,)",
    ),
    # (a longer cache_batch_idx is accepted: FA3 reads its first b entries)
    "cache_batch_idx_shape": (
        lambda a: dict(a, cache_batch_idx=torch.tensor([0], dtype=I32)),
        ValueError,
        "cache_batch_idx must have shape (2,) (batch,), got (1,)",
    ),
    "rotary_seqlens_shape": (
        lambda a: dict(rotary(a), rotary_seqlens=torch.tensor([1], dtype=I32)),
        ValueError,
        "rotary_seqlens must have shape (2,) (batch,), got (1,)",
    ),
    "cu_seqlens_k_new_batch": (
        lambda a: dict(
            a,
            k=torch.randn(3, 2, 16),
            v=torch.randn(3, 2, 16),
            cu_seqlens_k_new=torch.tensor([0, 1, 2, 3], dtype=I32),
        ),
        ValueError,
        "cu_seqlens_k_new must have shape (3,) (batch + 1,), got (4,)",
    ),
    "qv_shape": (
        lambda a: dict(a, qv=torch.randn(2, 2, 4, 8)),
        ValueError,
        "qv must have shape (2, 2, 4, 16) (q's shape with v's head dim), got (2, 2, 4, 8)",
    ),
    "rotary_sin_shape": (
        lambda a: dict(rotary(a), rotary_sin=torch.zeros(15, 8)),
        ValueError,
        "rotary_sin must have shape (16, 8) (same as rotary_cos), got (15, 8)",
    ),
    "descale_shape": (
        lambda a: dict(fp8(a), q_descale=torch.ones(2, 4)),
        ValueError,
        "q_descale must have shape (2, 2) (batch, h_k), got (2, 4)",
    ),
    "sinks_shape": (
        lambda a: dict(a, sinks=torch.zeros(2)),
        ValueError,
        "sinks must have shape (4,) (h,), got (2,)",
    ),
    "out_shape": (
        lambda a: dict(a, out=torch.empty(2, 2, 4, 8)),
        ValueError,
        "out must have shape (2, 2, 4, 16) (q's shape with v's head dim), got (2, 2, 4, 8)",
    ),
    "qv_stride": (
        lambda a: dict(a, qv=strided(2, 2, 4, 16)),
        ValueError,
        "qv must have contiguous last dimension",
    ),
    "out_stride": (
        lambda a: dict(a, out=strided(2, 2, 4, 16)),
        ValueError,
        "out must have contiguous last dimension",
    ),
    "heads_divide": (
        lambda a: dict(a, k_cache=torch.randn(2, 8, 3, 16), v_cache=torch.randn(2, 8, 3, 16)),
        ValueError,
        "the number of key/value heads (3) must divide the number of query heads (4)",
    ),
    "page_size_zero": (
        lambda a: drop(
            dict(paged(a), k_cache=torch.randn(8, 0, 2, 16), v_cache=torch.randn(8, 0, 2, 16)),
            "k",
            "v",
        ),
        ValueError,
        "with page_table, k_cache and v_cache must be (num_pages, page_size, h_k, dim) "
        "with page_size >= 1, got page_size 0",
    ),
    "batch_mismatch": (
        lambda a: dict(a, k_cache=torch.randn(3, 8, 2, 16), v_cache=torch.randn(3, 8, 2, 16)),
        ValueError,
        "without cache_batch_idx, the batch size of q (2) must equal k_cache.shape[0] (3)",
    ),
    "batch_mismatch_paged": (
        lambda a: dict(paged(a), page_table=torch.arange(12, dtype=I32).view(3, 4)),
        ValueError,
        "without cache_batch_idx, the batch size of q (2) must equal page_table.shape[0] (3)",
    ),
    # --- varlen offsets
    "max_seqlen_q_missing": (
        lambda a: dict(varlen(a), max_seqlen_q=None),
        ValueError,
        "max_seqlen_q must be provided if cu_seqlens_q is provided",
    ),
    "max_seqlen_q_too_small": (
        lambda a: dict(varlen(a), max_seqlen_q=2),
        ValueError,
        "max_seqlen_q=2 is smaller than the longest sequence in cu_seqlens_q (3)",
    ),
    "cu_seqlens_q_decreasing": (
        lambda a: dict(varlen(a), cu_seqlens_q=torch.tensor([0, 3, 2, 4], dtype=I32)),
        ValueError,
        "cu_seqlens_q must start at 0, never decrease and end at q.shape[0]=4, got [0, 3, 2, 4]",
    ),
    "cu_seqlens_q_total": (
        lambda a: dict(varlen(a), cu_seqlens_q=torch.tensor([0, 1, 3], dtype=I32)),
        ValueError,
        "cu_seqlens_q must start at 0, never decrease and end at q.shape[0]=4, got [0, 1, 3]",
    ),
    "cu_seqlens_k_new_total": (
        lambda a: dict(
            a,
            k=torch.randn(3, 2, 16),
            v=torch.randn(3, 2, 16),
            cu_seqlens_k_new=torch.tensor([0, 1, 2], dtype=I32),
        ),
        ValueError,
        "cu_seqlens_k_new must start at 0, never decrease and end at k.shape[0]=3, got [0, 1, 2]",
    ),
    "int_cache_seqlens_with_varlen_q": (
        lambda a: dict(drop(varlen(a), "k", "v"), cache_seqlens=4),
        ValueError,
        "cache_seqlens must be a (batch,) int32 tensor when cu_seqlens_q is given: sglang expands "
        "an int to q.shape[0] entries, which is total_q, not the batch size",
    ),
    # --- new keys and values
    "k_without_v": (
        lambda a: drop(a, "v"),
        ValueError,
        "k and v must be given together (new keys and values to append), got only one",
    ),
    "k_without_cache_seqlens": (
        lambda a: drop(a, "cache_seqlens"),
        ValueError,
        "cache_seqlens must be given when k and v are appended to the cache",
    ),
    # --- ranges
    "cache_batch_idx_range": (
        lambda a: dict(a, cache_batch_idx=torch.tensor([1, 2], dtype=I32)),
        ValueError,
        "cache_batch_idx values must lie in [0, 2), got [2]",
    ),
    "page_table_range": (
        lambda a: paged(a, pages=(7, 1, 4, 0, 2, 9, 3, 5)),
        ValueError,
        "page_table values must lie in [0, 8), got [9]",
    ),
    "leftpad_after_cache_seqlens": (
        lambda a: dict(a, cache_leftpad=torch.tensor([0, 6], dtype=I32)),
        ValueError,
        "batch entry 1: need 0 <= cache_leftpad <= cache_seqlens, got cache_leftpad=6, "
        "cache_seqlens=5",
    ),
    "negative_cache_seqlens": (
        lambda a: dict(a, cache_seqlens=-1),
        ValueError,
        "batch entry 0: need 0 <= cache_leftpad <= cache_seqlens, got cache_leftpad=0, "
        "cache_seqlens=-1",
    ),
    "capacity": (
        lambda a: dict(a, cache_seqlens=torch.tensor([3, 7], dtype=I32)),
        ValueError,
        "batch entry 1: cache_seqlens (7) + new tokens (2) exceeds the cache capacity (8 "
        "tokens per sequence)",
    ),
    "duplicate_writes": (
        lambda a: dict(
            a,
            cache_batch_idx=torch.tensor([1, 1], dtype=I32),
            cache_seqlens=torch.tensor([3, 4], dtype=I32),
        ),
        ValueError,
        "two batch entries would write the same cache slot (duplicate cache_batch_idx rows or "
        "shared pages among the appended positions)",
    ),
    # --- options
    "window_malformed": (
        lambda a: dict(a, window_size=(1,)),
        ValueError,
        "window_size must hold two ints (left, right) in int64 range, a negative side meaning "
        "unbounded, got (1,)",
    ),
    "window_float": (
        lambda a: dict(a, window_size=(1.9, -1)),
        ValueError,
        "window_size must hold two ints (left, right) in int64 range, a negative side meaning "
        "unbounded, got (1.9, -1)",
    ),
    "window_bool": (
        lambda a: dict(a, window_size=(True, -1)),
        ValueError,
        "window_size must hold two ints (left, right) in int64 range, a negative side meaning "
        "unbounded, got (True, -1)",
    ),
    "window_beyond_int64": (
        lambda a: dict(a, window_size=(10**30, -1)),
        ValueError,
        "window_size must hold two ints (left, right) in int64 range, a negative side meaning "
        f"unbounded, got ({10**30}, -1)",
    ),
    "attention_chunk_not_int": (
        lambda a: dict(a, attention_chunk="x"),
        ValueError,
        "attention_chunk must be None or convertible with int() to an int64 (<= 0 = off), got 'x'",
    ),
    "attention_chunk_beyond_int64": (
        lambda a: dict(a, attention_chunk=2**70),
        ValueError,
        "attention_chunk must be None or convertible with int() to an int64 (<= 0 = off), "
        f"got {2**70}",
    ),
    "softcap_none": (
        lambda a: dict(a, softcap=None),
        TypeError,
        "softcap must be a real number, got None: softcap=0.0 turns softcapping off",
    ),
    "softcap_inf": (
        lambda a: dict(a, softcap=float("inf")),
        ValueError,
        "softcap must be finite in float32 (|softcap| <= 3.4e38), got inf",
    ),
    "softcap_beyond_float32": (
        lambda a: dict(a, softcap=1e39),
        ValueError,
        "softcap must be finite in float32 (|softcap| <= 3.4e38), got 1e+39",
    ),
    "softcap_base2_overflows": (
        lambda a: dict(a, softcap=3e38),
        ValueError,
        "softcap · log2(e) must be finite in float32 (|softcap| <= 2.3587e38), got 3e+38",
    ),
    "softmax_scale_base2_overflows": (
        lambda a: dict(a, softmax_scale=-2.4e38),
        ValueError,
        "softmax_scale · log2(e) must be finite in float32 (|softmax_scale| <= 2.3587e38), "
        "got -2.4e+38",
    ),
    "softmax_scale_str": (
        lambda a: dict(a, softmax_scale="x"),
        TypeError,
        "softmax_scale must be a real number, got str",
    ),
    "softmax_scale_bool": (
        lambda a: dict(a, softmax_scale=True),
        TypeError,
        "softmax_scale must be a real number, got bool",
    ),
    "softmax_scale_nan": (
        lambda a: dict(a, softmax_scale=float("nan")),
        ValueError,
        "softmax_scale must be finite in float32 (|softmax_scale| <= 3.4e38), got nan",
    ),
    "softmax_scale_overflows": (
        lambda a: dict(a, softmax_scale=1e38),
        ValueError,
        re.compile(
            r"softmax_scale=1e\+38 can make the logits overflow float32 for these inputs "
            r"\(\|softmax_scale · q·k\| up to [0-9.e+]+\); use a smaller softmax_scale"
        ),
    ),
    "default_scale_zero_head_dim": (
        lambda a: dict(
            drop(a, "k", "v"), q=torch.randn(2, 2, 4, 0), k_cache=torch.randn(2, 8, 2, 0)
        ),
        ValueError,
        "softmax_scale=None means q.shape[-1] ** -0.5, which is undefined for a head dim of 0; "
        "pass softmax_scale",
    ),
    "zero_dim_v_cache": (
        lambda a: dict(a, v_cache=torch.tensor(1.0)),
        ValueError,
        "v_cache must have a last (head) dimension, got a 0-d tensor",
    ),
    "zero_dim_q_default_scale": (
        lambda a: dict(a, q=torch.tensor(1.0)),
        ValueError,
        "q must have a last (head) dimension, got a 0-d tensor",
    ),
    "max_seqlen_q_float": (
        lambda a: dict(varlen(a), max_seqlen_q=3.0),
        TypeError,
        "max_seqlen_q must be an int in int64 range, got 3.0",
    ),
    "num_splits_too_large": (
        lambda a: dict(a, num_splits=257),
        ValueError,
        "num_splits must be an int <= 256 (<= 0 = heuristic, 1 = no split), got 257",
    ),
    "num_splits_not_int": (
        lambda a: dict(a, num_splits=2.0),
        ValueError,
        "num_splits must be an int <= 256 (<= 0 = heuristic, 1 = no split), got 2.0",
    ),
    "num_splits_bool": (
        lambda a: dict(a, num_splits=True),
        ValueError,
        "num_splits must be an int <= 256 (<= 0 = heuristic, 1 = no split), got True",
    ),
    "causal_str": (
        lambda a: dict(a, causal="False"),
        TypeError,
        "causal must be a bool, got 'False'",
    ),
    "causal_per_sequence": (
        lambda a: dict(a, causal=torch.tensor([True, False])),
        TypeError,
        "causal must be a bool, got tensor([ True, False])",
    ),
    "only_qv_str": (lambda a: dict(a, only_qv="no"), TypeError, "only_qv must be a bool, got 'no'"),
    "return_softmax_lse_float": (
        lambda a: dict(a, return_softmax_lse=0.0),
        TypeError,
        "return_softmax_lse must be a bool, got 0.0",
    ),
    # --- memory the call writes (appended cache slots, out)
    "k_cache_requires_grad": (
        lambda a: dict(a, k_cache=a["k_cache"].requires_grad_()),
        ValueError,
        "k_cache requires grad, but the call writes it in place; pass a tensor that does not "
        "require grad (e.g. k_cache.detach())",
    ),
    "out_requires_grad": (
        lambda a: dict(a, out=torch.zeros(2, 2, 4, 16, requires_grad=True)),
        ValueError,
        "out requires grad, but the call writes it in place; pass a tensor that does not require "
        "grad (e.g. out.detach())",
    ),
    "v_cache_expanded": (
        lambda a: dict(
            a,
            v_cache=a["v_cache"][:1].expand(2, -1, -1, -1),
            cache_seqlens=torch.tensor([3, 5], dtype=I32),
        ),
        ValueError,
        "v_cache has elements that share memory (e.g. a stride-0 view from expand), but the call "
        "writes it in place; pass a tensor with its own memory per element (e.g. "
        "v_cache.contiguous())",
    ),
    "out_broadcast": (
        lambda a: dict(a, out=torch.zeros(1, 2, 4, 16).expand(2, -1, -1, -1)),
        ValueError,
        "out has elements that share memory (e.g. a stride-0 view from expand), but the call "
        "writes it in place; pass a tensor with its own memory per element (e.g. out.contiguous())",
    ),
    "k_cache_is_v_cache": (
        lambda a: dict(a, v_cache=a["k_cache"]),
        ValueError,
        "k_cache shares memory with v_cache, and the call writes k_cache: pass "
        "tensors that do not overlap",
    ),
    "v_cache_inside_k_cache": (
        _v_inside_k,
        ValueError,
        "k_cache shares memory with v_cache, and the call writes k_cache: "
        "pass tensors that do not overlap",
    ),
    "out_is_q": (
        lambda a: dict(drop(a, "k", "v"), out=a["q"]),
        ValueError,
        "out shares memory with q, and the call writes out: pass tensors that do not overlap",
    ),
    "out_inside_v_cache": (
        lambda a: dict(drop(a, "k", "v"), q=torch.randn(2, 8, 2, 16), out=a["v_cache"]),
        ValueError,
        "out shares memory with v_cache, and the call writes out: pass tensors that do not overlap",
    ),
    # --- rotary
    "rotary_one_table": (
        lambda a: dict(a, rotary_cos=torch.ones(16, 8)),
        ValueError,
        "rotary_cos and rotary_sin must be given together, got only one",
    ),
    "rotary_seqlens_negative": (
        lambda a: dict(rotary(a), rotary_seqlens=torch.tensor([1, -100], dtype=I32)),
        ValueError,
        "rotary_seqlens values must lie in [0, 16), got [-100]",
    ),
    "rotary_without_new_kv": (
        lambda a: drop(rotary(a), "k", "v"),
        ValueError,
        "If rotary cos/sin are provided, new key / value to be appended to "
        "KV cache must also be provided",
    ),
    "rotary_dim_too_large": (
        lambda a: rotary(a, dim=32),
        ValueError,
        "rotary_dim = 2 * rotary_cos.shape[1] must be a multiple of 16 and <= "
        "the head dim (16), got 32",
    ),
    "rotary_dim_not_multiple_of_16": (
        lambda a: rotary(a, dim=8),
        ValueError,
        "rotary_dim = 2 * rotary_cos.shape[1] must be a multiple of 16 and <= the head dim (16), "
        "got 8",
    ),
    "rotary_table_paged": (
        lambda a: rotary(paged(a), rows=7),
        ValueError,
        "with page_table, rotary_cos must have at least max_pages_per_seq * "
        "page_size = 8 rows, got 7",
    ),
    "rotary_table_short": (
        lambda a: rotary(a, rows=6),
        ValueError,
        "batch entry 1: rotary positions up to 6 are needed, but rotary_cos has only 6 rows",
    ),
}

#: ``PACKAGE_CHECKS`` entries whose calls upstream refuses as well (a C++ ``TORCH_CHECK`` of FA3's
#: ``mha_fwd``, raised before the kernel writes anything): a conforming implementation raises some
#: exception for each, with its own message, and leaves the caches as they were.
UPSTREAM_REJECTS = (
    "k_cache_dtype",
    "k_dtype",
    "page_table_dtype",
    "cache_seqlens_dtype",
    "cu_seqlens_q_dtype",
    "qv_dtype",
    "out_dtype",
    "k_cache_head_dim",
    "v_shape",
    "k_heads",
    "cache_seqlens_shape",
    "qv_shape",
    "out_shape",
    "heads_divide",
    "batch_mismatch",
    "max_seqlen_q_missing",
    "k_without_v",
    "k_without_cache_seqlens",
    "num_splits_too_large",
    "rotary_without_new_kv",
    "rotary_dim_too_large",
    "rotary_dim_not_multiple_of_16",
    "rotary_table_paged",
)


def message_matches(actual: str, expected) -> bool:
    """``expected`` is the exact text, or a compiled pattern for a message with data in it."""
    return (
        bool(expected.fullmatch(actual)) if isinstance(expected, re.Pattern) else actual == expected
    )
