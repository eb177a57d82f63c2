"""Addressing a KV cache inside a kernel: contiguous rows or pages (mirrors :mod:`attn_ref.paged`).

Logical position ``p`` of cache row ``r`` lives at

* contiguous cache ``(b_cache, s_cache, h_k, dim)``: ``cache[r, p]``;
* paged cache ``(num_pages, page_size, h_k, dim)``: ``cache[page_table[r, p // page_size], p %
  page_size]``, the page id loaded from the table for every position (so any page size works, pages
  in any order).

:func:`cache_slots` returns the int64 element offset of each token's ``[..., head 0, channel 0]``;
int64 because ``num_pages * page_size * h_k * dim`` overflows int32 for large caches. Masked-off
positions
read page 0 from the table and get an offset that must not be dereferenced (the loads are masked).
The offsets are deliberately not zeroed with ``tl.where``: a select hides their divisibility by 16
from the compiler, which then splits the K/V loads into 2-byte loads without ``cp.async``.
"""

import triton
import triton.language as tl


@triton.jit
def cache_slots(
    positions,  # (N,) int32: logical positions p in cache row `row`
    mask,  # (N,) bool: positions to address (the offsets of the others are meaningless)
    row,  # int32 scalar: cache row r (contiguous) or page-table row (paged)
    page_table_ptr,  # (b_k, max_pages) int32, read only when PAGED
    stride_table,  # page_table.stride(0)
    stride_major,  # cache.stride(0): per cache row / per page
    stride_minor,  # cache.stride(1): per position / per slot in a page
    page_size,  # P (runtime: any page size, one compiled variant)
    PAGED: tl.constexpr,
):
    """(N,) int64 offsets of the addressed tokens in the cache (element units)."""
    if PAGED:
        page_index = tl.where(mask, positions // page_size, 0)
        table_row = page_table_ptr + row.to(tl.int64) * stride_table
        pages = tl.load(table_row + page_index, mask=mask, other=0)
        major = pages.to(tl.int64)  # (N,) page ids
        minor = (positions % page_size).to(tl.int64)  # (N,) slots within the page
    else:
        major = row.to(tl.int64)
        minor = positions.to(tl.int64)
    return major * stride_major + minor * stride_minor
