"""kernels: Triton kernels with the same public API, errors and results as :mod:`attn_ref`.

* :func:`flash_attn_with_kvcache` - sglang's FA3 KV-cache attention (append with rotary, paged or
  contiguous caches, GQA packed into the M tile, masks, softcap, qv, sinks, varlen q, fp8 descale,
  split-KV with an LSE combine). Swap ``attn_ref.flash_attn_with_kvcache`` for it: same signature,
  same validation (it calls :func:`attn_ref.check_kvcache_args`), same return values. The intended
  differences: ``num_splits=0`` picks a split count by a heuristic (:mod:`kernels.splits`) where the
  reference uses 1; and the call can be captured in a CUDA graph: it reads no tensor value on the
  host when the value checks are off, which they are under capture (:mod:`kernels.host_checks`).
* :func:`no_host_checks` - a context manager that skips those value checks outside capture too
  (as ``ATTN_REF_HOST_CHECKS=0`` does).
* :func:`merge_attention_states` / :func:`combine_attention_states` - the LSE ⊕ of two / ``n``
  attention states (split-KV combine, ring attention), like :func:`attn_ref.merge_attention_states`.
* :func:`flash_attn_func`, :func:`flash_attn_varlen_func`, :func:`flash_attn_qkvpacked_func` -
  FA3's prefill and training entry points, differentiable (sglang's ``sinks`` on the varlen one),
  like :func:`attn_ref.flash_attn_func` and its siblings (the reference's checks and return
  layouts): one forward launch and one launch per backward kernel for all the sequences,
  deterministic (no atomics).
* :func:`flash_attn_combine` - FA3's combine of split-KV partial states, like
  :func:`attn_ref.flash_attn_combine` (same checks, same return layout).
* :func:`attention_backward` - the gradients of attention from its saved output and LSE (FA2-style
  dK/dV and dQ kernels), like :func:`attn_ref.attention_backward`.

Modules mirror the reference: :mod:`kernels.kvcache` (the launcher), :mod:`kernels.append`,
:mod:`kernels.attention`, :mod:`kernels.backward`, :mod:`kernels.flash_attn`, :mod:`kernels.merge`,
:mod:`kernels.paged`, :mod:`kernels.rotary`,
:mod:`kernels.splits`, :mod:`kernels.host_checks`. On a CPU they run through Triton's interpreter
(``TRITON_INTERPRET=1``, set
before import; bf16 is computed in fp32 there, see :mod:`kernels.launch`). Performance has been
designed for Hopper (H100/H200) but is only as measured in ``benchmarks/results/``.
"""

from .backward import attention_backward
from .flash_attn import (
    flash_attn_combine,
    flash_attn_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)
from .host_checks import no_host_checks
from .kvcache import flash_attn_with_kvcache
from .merge import combine_attention_states, merge_attention_states

__all__ = ["attention_backward", "combine_attention_states", "flash_attn_combine",
           "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "merge_attention_states", "no_host_checks"]
