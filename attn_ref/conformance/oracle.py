"""An independent dense formulation of ``flash_attn_with_kvcache``, written for the tests.

It shares no code with the implementations it checks (:mod:`attn_ref`'s tiled reference and the
kernels): it gathers each sequence's logical cache into dense K/V with its own indexing (FA's
``k_paged[page_table]`` view), rotates and dequantizes with its own code, and attends each sequence
with the dense formula of :mod:`attn_ref.dense` (explicit bottom-right masks, GQA heads repeated,
sinks as an extra logit column; the rules: ``docs/concepts/masks.md`` and
``docs/concepts/scores.md``).

``upcast=True`` is the float64 oracle of the whole call (:func:`kvcache_oracle`), its result cast to
the output dtype; ``upcast=False`` runs the same math in the low dtype with the scale applied to K
instead of q (FA's ``reorder_ops``), and for fp8 in bf16 with the probabilities rounded through fp8.
The pair feeds :func:`tolerance.fa_error`. It lives in the package for the conformance suite
(:mod:`attn_ref.conformance`); the tests import it as ``dense_oracle``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..dense import attention
from .tolerance import assert_close_fa, assert_lse_close, assert_one_rounding_apart

FP8 = torch.float8_e4m3fn


@dataclass
class OracleResult:
    out: torch.Tensor  # (b, sq, h, dv) or (total_q, h, dv); q's dtype (bf16 for fp8)
    lse: torch.Tensor  # (b, h, sq) or (h, total_q); fp32
    k_cache: Optional[torch.Tensor]  # the caches as they must be after the call
    v_cache: torch.Tensor


# --------------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------------


def rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, interleaved: bool
):
    """RoPE in the ``x * cos + rotate_half(x) * sin`` form; ``x (n, heads, dim)`` -> fp32."""
    rd = 2 * cos.shape[1]
    c, s = cos.float()[pos], sin.float()[pos]  # (n, rd/2)
    x = x.float()
    head, tail = x[..., :rd], x[..., rd:]
    if interleaved:  # channel pairs (0,1), (2,3), ...: angles repeated as (d 2)
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        half = torch.stack((-head[..., 1::2], head[..., 0::2]), -1).flatten(-2)
    else:  # GPT-NeoX: channel pairs (m, m + rd/2): angles repeated as (2 d)
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
        half = torch.cat((-head[..., rd // 2 :], head[..., : rd // 2]), -1)
    return torch.cat((head * c[:, None] + half * s[:, None], tail), -1)


def sdpa_attention(q, k, v, scale, visible):
    """Torch SDPA of one sequence with an explicit mask (``visible (s_q, s_k)``: True where row
    ``i`` sees key ``j``; every row must see a key)."""
    g = q.shape[1] // k.shape[1]
    qt, kt, vt = (
        x.float().transpose(0, 1) for x in (q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))
    )
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible, scale=scale)
    return out.transpose(0, 1)


# --------------------------------------------------------------------------------------------------
# The whole API
# --------------------------------------------------------------------------------------------------


def logical_cache(cache: torch.Tensor, page_table: Optional[torch.Tensor]) -> torch.Tensor:
    """``(b_k, capacity, h_k, dim)``: row ``r`` lists its tokens in order (pages concatenated)."""
    if page_table is None:
        return cache.clone()
    # (b_k, max_pages, P, ...) -> (b_k, max_pages*P, ...)
    return cache[page_table.long()].flatten(1, 2)


def readable_logical_cache(cache: torch.Tensor, page_table: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`logical_cache` for a call: table entries past a sequence's pages are never read, so
    they need not be valid page ids (zeros stand in for them where there is no page at all)."""
    if page_table is None:
        return logical_cache(cache, None)
    if cache.shape[0] == 0:
        return cache.new_zeros(
            page_table.shape[0], page_table.shape[1] * cache.shape[1], *cache.shape[2:]
        )
    return logical_cache(cache, page_table.clamp(0, cache.shape[0] - 1))


def physical_slots(
    row: int, positions: torch.Tensor, page_table: Optional[torch.Tensor], page_size: int
):
    """Index ``(major, minor)`` of logical ``positions`` of cache row ``row``: ``(row, p)``, or with
    a page table ``(page_table[row, p // P], p % P)``."""
    if page_table is None:
        return torch.full_like(positions, row), positions
    return page_table[row].long()[positions // page_size], positions % page_size


def kvcache_oracle(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=None,
    softcap=0.0,
    rotary_interleaved=True,
    only_qv=False,
    sinks=None,
    upcast=True,
) -> OracleResult:
    """Expected ``out``, ``lse`` and caches of a ``flash_attn_with_kvcache`` call (inputs
    untouched)."""
    ref = qv if only_qv else q
    dtype = ref.dtype
    fp8 = dtype == FP8
    out_dtype = torch.bfloat16 if fp8 else dtype
    h, dv = ref.shape[-2], v_cache.shape[-1]
    varlen = cu_seqlens_q is not None
    if varlen:
        q_off = cu_seqlens_q.tolist()
    else:
        q_off = [i * ref.shape[1] for i in range(ref.shape[0] + 1)]
    b = len(q_off) - 1
    paged = page_table is not None
    capacity = page_table.shape[1] * v_cache.shape[1] if paged else v_cache.shape[1]
    rows = cache_batch_idx.tolist() if cache_batch_idx is not None else list(range(b))
    if cache_seqlens is None:
        ends = [capacity] * b
    elif isinstance(cache_seqlens, int):
        ends = [cache_seqlens] * b
    else:
        ends = cache_seqlens.tolist()
    starts = cache_leftpad.tolist() if cache_leftpad is not None else [0] * b
    if k is None:
        new_off = [0] * (b + 1)
    elif cu_seqlens_k_new is not None:
        new_off = cu_seqlens_k_new.tolist()
    else:
        new_off = [i * k.shape[1] for i in range(b + 1)]
    k_new_rows = k.flatten(0, -3) if k is not None else None  # (total_new, h_k, d)
    v_new_rows = v.flatten(0, -3) if k is not None else None  # v alone is ignored, as in FA3
    q_rows = q.flatten(0, -3) if q is not None else None  # (total_q, h, d)
    qv_rows = qv.flatten(0, -3) if qv is not None else None
    # FA3 reads rotary_seqlens only with rotary tables
    ro_base = (
        rotary_seqlens.tolist() if rotary_seqlens is not None and rotary_cos is not None else ends
    )
    if softmax_scale is None:
        softmax_scale = (
            dv**-0.5 if only_qv else (q.shape[-1] + (dv if qv is not None else 0)) ** -0.5
        )
    chunk = max(int(attention_chunk or 0), 0)  # FA3: chunked only for > 0
    # FA3's kernels get a float32
    softcap = torch.tensor(float(softcap), dtype=torch.float32).item()
    # FA3 rotates every query at the base position unless the kernel runs causal or local; window
    # sides at least as wide as the static lengths do not count as local.
    static_sq = max_seqlen_q if varlen else ref.shape[1]
    wl, wr = int(window_size[0]), int(window_size[1])
    q_local = causal or chunk > 0 or 0 <= wl < capacity - 1 or 0 <= wr < static_sq - 1

    # 1. Append (rotated) new tokens to copies of the physical caches (a page listed twice in the
    #    table is one page: what one sequence appends there, another one reads), then view them
    #    logically.
    k_phys = k_cache.clone() if k_cache is not None else None
    v_phys = v_cache.clone()
    for i in range(b):
        n = new_off[i + 1] - new_off[i]
        if not n:
            continue
        new_k = k_new_rows[new_off[i] : new_off[i + 1]]
        if rotary_cos is not None:
            pos = torch.arange(ro_base[i], ro_base[i] + n)
            new_k = rope(new_k, rotary_cos, rotary_sin, pos, rotary_interleaved)
        slots = physical_slots(
            rows[i], torch.arange(ends[i], ends[i] + n), page_table, v_cache.shape[1]
        )
        if k_phys is not None:
            k_phys[slots] = new_k.to(dtype)
        v_phys[slots] = v_new_rows[new_off[i] : new_off[i + 1]]
    k_log = readable_logical_cache(k_phys, page_table) if k_phys is not None else None
    v_log = readable_logical_cache(v_phys, page_table)

    # 2. Attention of each sequence over its valid keys [leftpad, cache_seqlens + new).
    compute = torch.float64 if upcast else out_dtype
    one = lambda x: None if x is None else x.to(compute)[None]  # noqa: E731 (a batch of one)
    out = torch.zeros(q_off[-1], h, dv, dtype=out_dtype)
    # Zero-length KV tensors (no cache tokens, nothing appended): FA3 skips the kernel, lse = +inf.
    empty_kv = not paged and v_cache.shape[1] == 0 and (k is None or k.numel() == 0)
    lse = torch.full((h, q_off[-1]), float("inf") if empty_kv else float("-inf"))
    for i in range(0 if empty_kv else b):
        sq = q_off[i + 1] - q_off[i]
        stop = ends[i] + new_off[i + 1] - new_off[i]
        kk = k_log[rows[i], starts[i] : stop] if not only_qv else None
        vv = v_log[rows[i], starts[i] : stop]
        qq = q_rows[q_off[i] : q_off[i + 1]] if not only_qv else None
        qvq = qv_rows[q_off[i] : q_off[i + 1]] if qv is not None else None
        if rotary_cos is not None and not only_qv:
            pos = (
                torch.arange(ro_base[i], ro_base[i] + sq)
                if q_local
                else torch.full((sq,), ro_base[i])
            )
            qq = rope(qq, rotary_cos, rotary_sin, pos, rotary_interleaved)
        if fp8:  # dequantize: x * descale[i, kv head]
            g = h // vv.shape[1]
            if q_descale is not None and h:  # (no query heads: nothing to scale)
                qq = (qq.float().unflatten(1, (-1, g)) * q_descale[i][None, :, None, None]).flatten(
                    1, 2
                )
            if k_descale is not None:
                kk = kk.float() * k_descale[i][None, :, None]
            if v_descale is not None:
                vv = vv.float() * v_descale[i][None, :, None]
        o, l = attention(
            one(qq),
            one(kk),
            one(vv),
            softmax_scale,
            causal,
            (wl, wr),
            chunk,
            softcap,
            sinks,
            one(qvq),
            upcast=upcast,
            p_dtype=FP8 if fp8 and not upcast else None,
        )
        out[q_off[i] : q_off[i + 1]] = o[0].to(out_dtype)
        lse[:, q_off[i] : q_off[i + 1]] = l[0]

    if not varlen:
        sq = ref.shape[1]
        out = out.view(b, sq, h, dv)
        lse = lse.view(h, b, sq).transpose(0, 1).contiguous()
    return OracleResult(out, lse, k_phys, v_phys)


def assert_matches_oracle(fn, args: dict, **knobs):
    """Call ``fn(**args, **knobs, return_softmax_lse=True)`` (e.g. ``attn_ref`` or ``kernels``
    ``flash_attn_with_kvcache``) on copies of ``args`` and check it against the oracle.

    Output: FlashAttention's rule against the float64 oracle; LSE: fp32-tight; caches: exact, except
    keys rotated on the way in (one rounding apart). Returns the call's 4-tuple.
    """
    call_args = {
        key: val.clone() if isinstance(val, torch.Tensor) else val for key, val in args.items()
    }
    result = fn(**call_args, **knobs, return_softmax_lse=True)
    out, lse = result[0], result[1]
    ref = kvcache_oracle(**args)
    lowp = kvcache_oracle(**args, upcast=False)
    assert out.dtype == ref.out.dtype and lse.shape == ref.lse.shape, (
        out.dtype,
        lse.shape,
        ref.lse.shape,
    )
    assert_close_fa(
        out, ref.out, lowp.out, fp8=(args["qv"] if args.get("only_qv") else args["q"]).dtype == FP8
    )
    assert_lse_close(lse, ref.lse)
    assert torch.equal(call_args["v_cache"], ref.v_cache)
    if args["k_cache"] is not None:
        if args.get("rotary_cos") is None:
            assert torch.equal(call_args["k_cache"], ref.k_cache)
        else:
            assert_one_rounding_apart(call_args["k_cache"], ref.k_cache)
    return result
