# %% [markdown]
# # Test your own kernel against the reference
#
# You wrote a `flash_attn_with_kvcache` of your own: a CUDA kernel for another GPU, a wrapper around
# SDPA or FlashInfer, a CPU path. Does it behave like sglang's? The conformance suite answers
# feature by feature: it calls your function on random valid calls and compares out and LSE with a
# float64 oracle (FlashAttention's tolerance rule), checks what the call writes into the caches,
# which calls it refuses and how, and a few odd shapes. Every failure comes with a script that
# reproduces it.
#
# This notebook writes a small implementation with three mistakes, lets the suite find them, fixes
# them, and shows the command line and the pytest entry.

# %%
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # only matters for Triton targets on a CPU

from attn_ref.conformance import CAPABILITIES, run_conformance

# %% [markdown]
# ## A first implementation
#
# Dense caches, appending, GQA, causal and sliding windows, `cache_leftpad`, an explicit
# `softmax_scale`: one sequence at a time in PyTorch. Everything else raises `NotImplementedError`,
# and the module says so in `CONFORMANCE_UNSUPPORTED`, a list of the suite's capability names. The
# suite reads that attribute from the target's module (or `--unsupported` on the command line); the
# features that need one of them are reported "not supported" rather than failed.
#
# The implementation lives in a module file, `my_attention.py`, so that the repro scripts of the
# report can import it.

# %%
HEADER = '''
"""my_attention: a small PyTorch flash_attn_with_kvcache (dense caches only)."""
import torch

CONFORMANCE_UNSUPPORTED = ["paged", "cache_batch_idx", "varlen_q", "varlen_new", "chunk",
                           "softcap", "sinks", "qv", "only_qv", "rotary", "rotary_seqlens",
                           "num_splits", "fp8", "out", "ver", "sglang_errors"]

def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
                            cache_leftpad=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), return_softmax_lse=False, **others):
    if others:
        raise NotImplementedError(f"my_attention does not implement {sorted(others)}")
'''
BODY = """
    b, sq, h, d = q.shape
    h_k, dv = v_cache.shape[2], v_cache.shape[3]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    lengths = cache_seqlens if cache_seqlens is not None else k_cache.shape[1]
    seqlens = torch.as_tensor(lengths).expand(b).tolist()
    starts = cache_leftpad.tolist() if cache_leftpad is not None else [0] * b
    new = 0 if k is None else k.shape[1]
    out = q.new_zeros(b, sq, h, dv)
    lse = torch.full((b, h, sq), float("-inf"), device=q.device)
    left, right = window_size[0], 0 if causal else window_size[1]
    for i in range(b):
        if new:
            k_cache[i, seqlens[i]:seqlens[i] + new] = k[i]
            v_cache[i, seqlens[i]:seqlens[i] + new] = v[i]
        first, end = FIRST_KEY, seqlens[i] + new
        keys = k_cache[i, first:end].float().repeat_interleave(h // h_k, dim=1)  # (sk, h, d)
        values = v_cache[i, first:end].float().repeat_interleave(h // h_k, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[i].float(), keys) * scale
        # bottom-right aligned
        row = torch.arange(sq, device=q.device)[:, None] + (end - first) - sq
        col = torch.arange(end - first, device=q.device)
        hidden = torch.zeros(sq, end - first, dtype=torch.bool, device=q.device)
        if right >= 0:
            hidden |= col > row + right
        if left >= 0:
            hidden |= col < row - left
        scores = scores.masked_fill(hidden, float("-inf"))
        lse[i] = torch.logsumexp(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[i] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    return (out, lse) if return_softmax_lse else out
"""

folder = Path(tempfile.mkdtemp())
sys.path.insert(0, str(folder))
os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])


def write_module(header, body, first_key="0"):
    """Write my_attention.py and (re)import it."""
    (folder / "my_attention.py").write_text(header + body.replace("FIRST_KEY", first_key))
    import my_attention

    return importlib.reload(my_attention)


my_attention = write_module(HEADER, BODY)  # the first key is always position 0

# %% [markdown]
# ## The report
#
# `run_conformance` takes a `module:function` string (or the function). `select="quick"` runs one
# probe per feature, a few seconds for a PyTorch implementation on a CPU; `default` and `full` run
# more variants at larger sizes. The report lists every feature: pass, fail or not supported, the
# worst error as a ratio of the allowed error (at most 1 passes), and the time. `my_attention`
# exports none of FA3's prefill functions (`flash_attn_func`...), so the last line says that the
# suite's prefill section is not applicable.

# %%
report = run_conformance("my_attention:flash_attn_with_kvcache", select="quick")
print(report.text(repros=False))

# %% [markdown]
# Three features fail, each for its own reason:
#
# * `values/leftpad`: the keys before `cache_leftpad` are attended. The first version always starts
#   at position 0.
# * `errors/caches_untouched`: calls that upstream refuses (a `k` of another dtype than the cache, a
#   `cache_seqlens` of the wrong shape, ...) are accepted, and the cache is written.
# * `odd_shapes/zero_length_keys`: with zero-length KV tensors, FlashAttention 3 returns an LSE of
#   +inf (it skips its kernel), not the -inf of an empty softmax.
#
# Each failure has a repro script: the seeded arguments, the exact call, and the suite's own check.
# Pasted into a file, it prints the verdict and ends with an `AssertionError` while the bug is
# there.

# %%
leftpad = next(f for f in report.failed if f.name == "values/leftpad")
print(leftpad.failures[0].detail)
print()
print(leftpad.failures[0].repro)

# %%
script = folder / "repro_leftpad.py"
script.write_text(leftpad.failures[0].repro)
run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
print("exit status", run.returncode)
print(run.stdout)

# %% [markdown]
# ## The fixes
#
# The keys start at `cache_leftpad`; the arguments are checked before anything is written (a
# conforming implementation refuses what upstream refuses, and leaves the cache as it was); and
# zero-length KV tensors give +inf.

# %%
CHECKS = """
    b, sq, h, d = q.shape
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError("q, k_cache and v_cache must have one dtype")
    if k_cache.shape[:3] != v_cache.shape[:3] or k_cache.shape[3] != d:
        raise ValueError("k_cache must be (batch, seqlen, h_k, d) and "
                         "v_cache (batch, seqlen, h_k, dv)")
    if v_cache.shape[0] != b or h % v_cache.shape[2]:
        raise ValueError("the caches need q's batch and a number of heads that divides q's")
    if (k is None) != (v is None) or (k is not None and cache_seqlens is None):
        raise ValueError("k and v go together, and need cache_seqlens")
    if k is not None and (k.dtype != q.dtype or v.dtype != q.dtype
                          or k.shape[2:] != k_cache.shape[2:]
                          or v.shape != (*k.shape[:3], v_cache.shape[3]) or k.shape[0] != b):
        raise ValueError("k and v must be (batch, seqlen_new, h_k, d | dv) in q's dtype")
    if isinstance(cache_seqlens, torch.Tensor) and (cache_seqlens.dtype != torch.int32
                                                    or cache_seqlens.shape != (b,)):
        raise ValueError("cache_seqlens must be a (batch,) int32 tensor")
    # zero-length KV tensors: FA3's +inf LSE
    if v_cache.shape[1] == 0 and (k is None or k.shape[1] == 0):
        out = q.new_zeros(b, sq, h, v_cache.shape[3])
        lse = torch.full((b, h, sq), float("inf"), device=q.device)
        return (out, lse) if return_softmax_lse else out
"""
my_attention = write_module(HEADER + CHECKS, BODY, first_key="starts[i]")
report = run_conformance("my_attention:flash_attn_with_kvcache", select="quick")
print(report.text())
assert report.exit_status == 0

# %% [markdown]
# Nothing fails now; the features it does not implement are listed as such, never skipped in
# silence. The capability names are:

# %%
for name, what in CAPABILITIES.items():
    print(f"{name:<16} {what}")

# %% [markdown]
# ## From the command line
#
# `python -m attn_ref.conformance TARGET` runs the same suite and prints the same report; it exits
# with 0 only when nothing failed (1 otherwise, 2 for a bad command line). `--select` takes a size
# or feature and family names, `--report` writes the report as JSON, `--device cuda` runs the
# target on a GPU (the oracle stays on the CPU), `--dtype` picks fp16, bf16 or fp32 inputs.

# %%
cli = subprocess.run(
    [
        sys.executable,
        "-m",
        "attn_ref.conformance",
        "my_attention:flash_attn_with_kvcache",
        "--select",
        "values,odd_shapes",
        "--dtype",
        "fp16",
        "--report",
        str(folder / "report.json"),
    ],
    capture_output=True,
    text=True,
)
print("exit status", cli.returncode)
print(cli.stdout)

# %% [markdown]
# ## Inside your own pytest session
#
# `conformance_test` makes a pytest test function with one test per feature: a failure shows the
# verdict and the repro script, a feature that needs a declared-unsupported capability is skipped
# with the reason "not supported".
#
# ```python
# # tests/test_my_attention_conformance.py
# from attn_ref.conformance.pytest import conformance_test
#
# test_my_attention = conformance_test("my_attention:flash_attn_with_kvcache", select="default")
# ```
#
# On a CUDA machine, the same suite runs against sglang's wrapper
# (`sgl_kernel.flash_attn:flash_attn_with_kvcache`) or FlashAttention 3
# (`flash_attn_interface:flash_attn_with_kvcache --unsupported
# only_qv,sinks,out,ver,sglang_errors`); see the [conformance page](../../conformance/).
