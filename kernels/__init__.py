"""kernels: Triton GPU kernels with the same public API and errors as :mod:`attn_ref`.

Work in progress: the split-KV / paged / GQA ``flash_attn_with_kvcache`` kernels land here next.
On a CPU they run through Triton's interpreter (``TRITON_INTERPRET=1``, set before import).
"""
