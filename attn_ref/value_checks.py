"""The value checks of ``flash_attn_with_kvcache`` (phase 2b of
:func:`attn_ref.validation.check_kvcache_args`): the checks that read index tensors (and, with a
huge ``softmax_scale``, the data) back to the host.

They run after every static check, so an input with errors of both kinds reports the static one;
only the ``cu_seqlens_*`` offsets are read among the static checks, as they define the batch
structure. ``value_checks=False`` skips them (the kernels do inside a CUDA graph capture, see
:mod:`kernels.host_checks`): nothing then reads a device value on the host.
:func:`check_kvcache_values` lists them in the order they run; they follow it, top to bottom.
"""

from __future__ import annotations

import dataclasses

import torch

from .argument_checks import _require_index_range
from .call import FLOAT32_MAX, LARGE_SCALE, KVCacheCall
from .overlap import _cache_write_offsets, _require_unshared, _storage_starts
from .paged import flat_slot_index


def check_kvcache_values(
    call: KVCacheCall, arguments: dict, max_seqlen_q, batch_k: int
) -> KVCacheCall:
    """The value checks of a statically checked call (phase 2b of
    :func:`~attn_ref.validation.check_kvcache_args`), in this order; they read the index tensors
    (and, with a huge ``softmax_scale``, the data) back to the host. Returns ``call`` with
    ``batch_host``, its per-batch values as Python ints (the phases read them there).

    ``arguments``: the tensor arguments by name, as given (for the memory-sharing check of the
    appended cache slots); ``max_seqlen_q``: as given; ``batch_k``: the cache rows (or page-table
    rows) there are.
    """
    call = dataclasses.replace(call, batch_host=call.batch.tolist())
    _check_max_seqlen_q(call, max_seqlen_q)
    _require_index_range("cache_batch_idx", call.batch_host.cache_rows, 0, batch_k)
    _check_cache_extents(call)
    _check_pages(call)
    _check_write_conflicts(call)
    _check_rotary_rows(call)
    _require_finite_logits(call)
    _check_writes_unshared(call, arguments)
    return call


def _check_max_seqlen_q(call: KVCacheCall, max_seqlen_q) -> None:
    """With varlen q, no sequence of ``cu_seqlens_q`` is longer than ``max_seqlen_q`` (the static
    bound)."""
    seqlens_q = call.batch_host.seqlens_q
    if call.varlen_q and max(seqlens_q, default=0) > call.seqlen_q_bound:
        raise ValueError(
            f"max_seqlen_q={max_seqlen_q} is smaller than the longest sequence in "
            f"cu_seqlens_q ({max(seqlens_q)})"
        )


def _check_cache_extents(call: KVCacheCall) -> None:
    """Each entry's cache: ``0 <= leftpads[i] <= cache_seqlens[i]`` and ``cache_seqlens[i] +
    new_lens[i]`` within the capacity."""
    batch, capacity = call.batch_host, call.capacity
    leftpads, seqlens_c, new_lens = batch.leftpads, batch.cache_seqlens, batch.new_lens
    for i in range(call.batch_size):
        if not 0 <= leftpads[i] <= seqlens_c[i]:
            raise ValueError(
                f"batch entry {i}: need 0 <= cache_leftpad <= cache_seqlens, got "
                f"cache_leftpad={leftpads[i]}, cache_seqlens={seqlens_c[i]}"
            )
        if seqlens_c[i] + new_lens[i] > capacity:
            raise ValueError(
                f"batch entry {i}: cache_seqlens ({seqlens_c[i]}) + new tokens ({new_lens[i]}) "
                f"exceeds the cache capacity ({capacity} tokens per sequence)"
            )


def _check_pages(call: KVCacheCall) -> None:
    """The pages an entry touches (the first ``ceil((cache_seqlens[i] + new_lens[i]) /
    page_size)`` of its page-table row) exist."""
    if call.page_table is None:
        return
    rows, batch = call.page_table.tolist(), call.batch_host
    used = [
        p
        for i in range(call.batch_size)
        for p in rows[batch.cache_rows[i]][
            : -(-(batch.cache_seqlens[i] + batch.new_lens[i]) // call.page_size)
        ]
    ]
    _require_index_range("page_table", used, 0, call.k_cache.shape[0])


def _check_write_conflicts(call: KVCacheCall) -> None:
    """No two batch entries append into one cache slot (FA3 would leave "any of the duplicates")."""
    if not call.appending:
        return
    table = call.page_table.cpu() if call.page_table is not None else None
    batch = call.batch_host
    written = torch.cat(
        [
            flat_slot_index(
                call.k_cache,
                batch.cache_rows[i],
                torch.arange(batch.cache_seqlens[i], batch.cache_seqlens[i] + batch.new_lens[i]),
                table,
            )
            for i in range(call.batch_size)
        ]
    )
    if written.unique().numel() != written.numel():
        raise ValueError(
            "two batch entries would write the same cache slot (duplicate cache_batch_idx "
            "rows or shared pages among the appended positions)"
        )


def _check_rotary_rows(call: KVCacheCall) -> None:
    """The rotary table rows read exist: ``rotary_starts[i] .. rotary_starts[i] + s_new - 1`` for
    the keys, ``rotary_starts[i]`` (``.. + s_q - 1`` unless the queries' position is fixed) for the
    queries."""
    rotary_cos, batch = call.rotary_cos, call.batch_host
    rotary_starts = batch.rotary_starts
    if rotary_cos is None:
        return
    for i in range(call.batch_size):
        seqlen_q, new_len = batch.seqlens_q[i], batch.new_lens[i]
        q_rows = (
            0 if call.only_qv or seqlen_q == 0 else 1 if call.rotary_q_fixed_position else seqlen_q
        )
        if max(new_len, q_rows) == 0:
            continue
        if rotary_starts[i] < 0:  # would wrap to the table's last rows (PyTorch) or read before it
            _require_index_range("rotary_seqlens", [rotary_starts[i]], 0, rotary_cos.shape[0])
        last_key, last_q = rotary_starts[i] + new_len, rotary_starts[i] + q_rows
        if max(last_key, last_q) > rotary_cos.shape[0]:
            raise ValueError(
                f"batch entry {i}: rotary positions up to {max(last_key, last_q) - 1} are "
                f"needed, but rotary_cos has only {rotary_cos.shape[0]} rows"
            )


def _require_finite_logits(call: KVCacheCall) -> None:
    """With a huge ``softmax_scale`` (``|scale| >`` :data:`LARGE_SCALE`, no softcap) the logits
    ``scale · s`` can leave float32 (FA3 then returns NaN): refuse the call if
    ``|scale| · Σ_c max|q_c| · max|k_c|`` (plus the ``qv · V`` term) can reach float32's range, with
    ``|s|`` bounded by head dim x largest entries (rotary at most doubles an entry, an fp8 descale
    multiplies it)."""
    scale = call.softmax_scale
    if not (call.softcap == 0 and abs(scale) > LARGE_SCALE):
        return

    def largest(*tensors):
        found = [
            t[i].float().abs().max().item()
            for t in tensors
            if t is not None
            for i in range(t.shape[0])
            if t[i].numel()
        ]
        return max(found, default=0.0)

    growth = (2.0 if call.rotary_cos is not None else 1.0) ** 2
    for d in (call.q_descale, call.k_descale) if call.is_fp8 else ():
        growth *= largest(d) if d is not None else 1.0
    bound = (
        0.0
        if call.only_qv
        else call.q.shape[-1] * largest(call.q) * largest(call.k_cache, call.k) * growth
    )
    if call.qv is not None:
        bound += call.qv.shape[-1] * largest(call.qv) * largest(call.v_cache, call.v)
    bound *= abs(scale)
    if bound > FLOAT32_MAX / 4:  # margin for the base-2 logits and the log-sum-exp
        raise ValueError(
            f"softmax_scale={scale:.7g} can make the logits overflow float32 for these inputs "
            f"(|softmax_scale · q·k| up to {bound:.3g}); use a smaller softmax_scale"
        )


def _check_writes_unshared(call: KVCacheCall, arguments: dict) -> None:
    """The appended cache slots (:func:`_cache_write_offsets`) are not memory of another
    argument."""
    if not call.appending:
        return
    starts = _storage_starts(arguments)
    for name in ("k_cache", "v_cache"):
        offsets = lambda cache=arguments[name]: _cache_write_offsets(  # noqa: E731
            cache,
            call.page_table,
            call.batch_host.cache_rows,
            call.batch_host.cache_seqlens,
            call.batch_host.new_lens,
        )
        _require_unshared(name, offsets, arguments, starts)
