"""The Triton attention backward (:func:`kernels.backward.attention_backward`), under the
interpreter on CPU.

* fp16/bf16/fp32, causal (bottom-right) and full, GQA, ``Sq != Sk``, head dims 16..256, with and
  without an LSE gradient: the gradients match float64 autograd of dense attention by
  FlashAttention's rule (baseline: autograd through dense attention in the input dtype).
* fp16, every mask of :data:`backward_cases.MASKS` (sliding window, chunk, softcap, with and without
  causal) on a problem of several query and key blocks, so that whole tiles are skipped: the same
  rule against float64 autograd of the forward's oracle.
* fp32: equal to the reference backward within fp32 noise, also for rows that see no key (causal,
  window and chunk with ``Sq > Sk``), non-contiguous inputs and ``grad_dtype``.
* Wired into ``kernels.sequence_parallel``: gradients through the kernel backend equal the
  reference backend's.
* The three kernels compile for CUDA sm_90 and sm_80 without a GPU (a subprocess without
  ``TRITON_INTERPRET``, as in :mod:`test_kernel_compile`, whose signature builder it uses), for the
  variants :data:`COMPILE_VARIANTS` plan, batched and packed (the varlen backward of
  :mod:`kernels.flash_attn`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attn_ref
from attn_ref import sequence_parallel as sp
from attn_ref.masks import CAUSAL
from backward_cases import (
    MASKS,
    assert_backward_matches_float64,
    backward_keywords,
    random_problem,
    saved_forward,
)

kernels_backward = pytest.importorskip("kernels.backward")

SHAPES = [  # (B, Sq, Sk, H, Hkv, D)
    (2, 24, 40, 4, 2, 32),
    (1, 70, 70, 2, 1, 40),
    (1, 17, 33, 2, 2, 256),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_float64_autograd(shape, dtype, causal):
    assert_backward_matches_float64(
        kernels_backward.attention_backward, shape, dtype, sum(shape) + causal, causal=causal
    )


@pytest.mark.parametrize(
    "masks",
    [m for name, m in MASKS.items() if name not in ("full", "causal")],
    ids=[name for name in MASKS if name not in ("full", "causal")],
)
def test_kernel_masks_match_float64_autograd(masks):
    """fp16 (bf16 is unreliable in the interpreter); 2 query blocks x 3 key blocks of 64."""
    assert_backward_matches_float64(
        kernels_backward.attention_backward,
        (1, 96, 192, 2, 1, 32),
        torch.float16,
        len(masks),
        **masks,
    )


#: Masks under which rows of ``Sq > Sk`` see no key, and a softcapped window.
EMPTY_ROW_MASKS = {
    "full": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(4, 2)),
    "chunk-softcap": dict(attention_chunk=6, softcap=2.0),
}


@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("masks", EMPTY_ROW_MASKS.values(), ids=EMPTY_ROW_MASKS.keys())
def test_kernel_equals_reference_fp32(masks, with_dlse):
    """Sq > Sk: with causal or the window the first rows see no key; inputs are non-contiguous
    views."""
    q, k, v, dout, dlse = random_problem((2, 45, 20, 4, 2, 24), torch.float32, 3 + len(masks))
    # [B, S, H, D] views
    q, dout = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, dout))
    scale = 0.2
    out, lse = saved_forward(q, k, v, scale, **masks)
    dlse = dlse if with_dlse else None
    keywords = backward_keywords(**masks)
    grads = kernels_backward.attention_backward(
        dout, q, k, v, out, lse, scale, dlse=dlse, **keywords
    )
    expected = attn_ref.attention_backward(dout, q, k, v, out, lse, scale, dlse=dlse, **keywords)
    for grad, grad_ref in zip(grads, expected):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-5)
    if masks.get("causal") or "window_size" in masks:
        assert torch.isinf(lse[..., :20]).all()
        assert torch.equal(grads[0][:, :20], torch.zeros_like(grads[0][:, :20]))


def test_kernel_grad_dtype():
    q, k, v, dout, _ = random_problem((1, 8, 8, 2, 2, 16), torch.float16, 0)
    out, lse = saved_forward(q, k, v, 0.25)
    grads = kernels_backward.attention_backward(
        dout, q, k, v, out, lse, 0.25, grad_dtype=torch.float32
    )
    assert [g.dtype for g in grads] == [torch.float32] * 3


def test_kernel_sequence_parallel_gradients_equal_the_reference():
    """One rank: USPAttention (local attention) and ring_attention (a ring of one) on both
    backends."""
    ksp = pytest.importorskip("kernels.sequence_parallel")
    q, k, v, dout, _ = random_problem((1, 16, 16, 4, 2, 16), torch.float32, 11)
    grads = {}
    for api in (sp, ksp):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = api.USPAttention(4, 16, 2, causal=True)(*leaves)
        ring_out, ring_lse = api.ring_attention(*leaves, causal=True, zigzag=True)
        torch.autograd.backward([out, ring_out, ring_lse], [dout, dout, torch.ones_like(ring_lse)])
        grads[api.__name__] = [x.grad for x in leaves]
    for grad, grad_ref in zip(grads[ksp.__name__], grads[sp.__name__]):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-5)


#: (dtype, head dim, softcap, GQA, with dlse, packed): every constexpr branch of the three kernels
#: (the masks are runtime values), on batched tensors and on packed sequences (varlen: batch stride
#: 0, the rows placed by the sequence table).
COMPILE_VARIANTS = [
    (torch.float16, 128, False, True, True, False),
    (torch.bfloat16, 256, False, True, False, False),
    (torch.bfloat16, 64, True, False, True, False),
    (torch.float32, 64, True, True, False, False),
    (torch.bfloat16, 128, False, True, True, True),
    (torch.float16, 64, True, False, False, True),
]


def _compile_launches(dtype, d, softcap, gqa, with_dlse, packed):
    """The launches of one backward call (``B=2, Sq=128, Sk=192, H=8``; packed: the same two
    sequences laid end to end), planned as the launchers do."""
    from kernels.backward import batch_sequences, plan_dkdv, plan_dq, plan_preprocess

    b, sq, sk, h = 2, 128, 192, 8
    hk = 2 if gqa else h
    rows, keys = ((b * sq,), (b * sk,)) if packed else ((b, sq), (b, sk))
    q, out = torch.empty(*rows, h, d, dtype=dtype), torch.empty(*rows, h, d, dtype=dtype)
    k, v = torch.empty(*keys, hk, d, dtype=dtype), torch.empty(*keys, hk, d, dtype=dtype)
    stats = torch.empty(h, b * sq) if packed else torch.empty(b, h, sq)  # lse and delta, fp32
    dlse = torch.empty(stats.shape) if with_dlse else None
    sequences = batch_sequences(b, sq, sk, "cpu")
    if packed:  # sequence i starts at row i * sq, key i * sk
        sequences = sequences._replace(
            q_starts=torch.tensor([0, sq], dtype=torch.int32),
            k_starts=torch.tensor([0, sk], dtype=torch.int32),
        )
    softcap = 30.0 if softcap else 0.0
    return [
        plan_preprocess(out, out, dlse, stats, sequences, sq),
        plan_dkdv(
            q,
            k,
            v,
            out,
            stats,
            stats,
            torch.empty(k.shape),
            torch.empty(v.shape),
            sequences,
            (sq, sk),
            0.1,
            CAUSAL,
            softcap,
        ),
        plan_dq(
            q,
            k,
            v,
            out,
            stats,
            stats,
            torch.empty(q.shape),
            sequences,
            (sq, sk),
            0.1,
            CAUSAL,
            softcap,
        ),
    ]


def compile_all(arch: int) -> dict[str, str]:
    """Compile every variant for ``cuda`` ``arch``: ``{variant/kernel: "ok" or the error}``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from compile_launches import launch_signature

    results = {}
    for variant in COMPILE_VARIANTS:
        for launch in _compile_launches(*variant):
            label = f"{variant}/{launch.kernel.__name__}"
            signature, constexprs, attrs = launch_signature(launch)
            try:
                source = ASTSource(
                    fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs
                )
                compiled = triton.compile(
                    source,
                    target=GPUTarget("cuda", arch, 32),
                    options=dict(num_warps=launch.num_warps, num_stages=launch.num_stages),
                )
                results[label] = "ok" if compiled.asm.get("cubin") else "no cubin produced"
            except Exception as error:  # reported per variant by the test below
                results[label] = f"{type(error).__name__}: {error}"[:2000]
    return results


@pytest.mark.parametrize("arch", [90, 80], ids=["sm_90", "sm_80"])
def test_backward_kernels_compile(arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tests_dir = Path(__file__).parent
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tests_dir), str(tests_dir.parent), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, __file__, str(arch)], env=env, capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {label: error for label, error in results.items() if error != "ok"}
    assert not failed, "\n\n".join(f"{label}: {error}" for label, error in failed.items())
    assert len(results) == 3 * len(COMPILE_VARIANTS)


if __name__ == "__main__":
    print(json.dumps(compile_all(int(sys.argv[1]))))
