"""attn_ref: the readable PyTorch reference of modern LLM attention.

The specification in code, and the numerical oracle the Triton kernels (:mod:`kernels`) are tested
against. All math runs in fp32 whatever the input dtype. Layout ``(batch, seq, heads, head_dim)``.

* :mod:`attn_ref.dense` - the formula itself, dense (:func:`~attn_ref.dense.attention`,
  :func:`~attn_ref.dense.visible`): what the rest computes faster.
* :func:`flash_attn_with_kvcache` - sglang's FA3 KV-cache attention API.
* :func:`flash_attn_func`, :func:`flash_attn_varlen_func`, :func:`flash_attn_qkvpacked_func` -
  FA3's prefill and training entry points, differentiable; :func:`flash_attn_combine`, FA3's
  combine of split-KV partial states.
* Building blocks: :func:`attention_with_lse`, :class:`AttentionMask`, :func:`apply_rotary`,
  :func:`gather_cache` / :func:`paged_to_dense`, :func:`merge_attention_states` /
  :func:`combine_attention_states`, :func:`split_bounds`.
* :func:`check_kvcache_args` - the validation shared with the kernels.
* :func:`attention_backward` - the gradients of attention from its saved output and LSE.
"""

from . import dense
from .attention import attention_with_lse
from .backward import attention_backward
from .call import KVCacheCall
from .flash_attn import (
    flash_attn_combine,
    flash_attn_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)
from .kvcache import flash_attn_with_kvcache
from .masks import AttentionMask
from .merge import combine_attention_states, merge_attention_states
from .paged import cache_slots, gather_cache, paged_to_dense, scatter_cache
from .rotary import apply_rotary
from .splits import split_bounds
from .validation import check_kvcache_args

__all__ = [
    "AttentionMask",
    "KVCacheCall",
    "apply_rotary",
    "attention_backward",
    "attention_with_lse",
    "cache_slots",
    "check_kvcache_args",
    "combine_attention_states",
    "dense",
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "gather_cache",
    "merge_attention_states",
    "paged_to_dense",
    "scatter_cache",
    "split_bounds",
]
