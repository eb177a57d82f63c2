"""Bounded memory of FA3's training entry point on the reference: a 16k-token packed batch through
:func:`attn_ref.flash_attn_varlen_func`, forward and backward, creates no tensor larger than the
score budget :data:`attn_ref.attention.MAX_SCORE_ELEMENTS`.

Every tensor an ATen operation returns (inside the forward, the autograd backward and the
reference's own backward, :func:`attn_ref.backward.attention_backward`) is seen by a
``TorchDispatchMode`` that records the largest. The heads are few and small (2 query heads over 1
KV head, ``d = 8``), so every per-token tensor (q, out, the gradients) holds under ``2^19``
elements, while the longest sequence's scores hold ``2 · 9000² ≈ 1.6e8``. With the budget lowered to
``2^19`` the row tiles of both passes must shrink below their usual 64 rows (a 64-row tile of the
9000-key sequence is ``1.15e6`` elements): the largest tensor of each pass is then a score tile,
within the budget and more than half of it (which shows the probe sees the tiles). The last
sequence's output and gradients are checked against float64 autograd of the dense formula.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import attn_ref
from attn_ref import dense

#: The packed batch: four sequences, 16384 tokens, each attending its own keys (causal).
LENGTHS = [9000, 4000, 2000, 1384]
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 8
#: The lowered score budget of the test.
BUDGET = 1 << 19


class LargestTensor(TorchDispatchMode):
    """Records the element count and shape of the largest tensor any ATen operation returns."""

    def __init__(self):
        super().__init__()
        self.numel, self.shape, self.op = 0, None, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for x in tree_leaves(result):
            if isinstance(x, torch.Tensor) and x.numel() > self.numel:
                self.numel, self.shape, self.op = x.numel(), tuple(x.shape), str(func)
        return result


def test_16k_token_batch_forward_and_backward_stay_within_the_score_budget(monkeypatch):
    assert sum(LENGTHS) == 16384
    # the longest sequence's scores exceed the real budget, which exceeds the test's
    assert HEADS * max(LENGTHS) ** 2 > attn_ref.attention.MAX_SCORE_ELEMENTS > BUDGET
    for module in (attn_ref.attention, attn_ref.backward):
        monkeypatch.setattr(module, "MAX_SCORE_ELEMENTS", BUDGET)
    gen = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    q = torch.randn(total, HEADS, HEAD_DIM, generator=gen).requires_grad_()
    k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen).requires_grad_()
    v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen).requires_grad_()
    dout = torch.randn(total, HEADS, HEAD_DIM, generator=gen)
    cu_seqlens = torch.tensor([0] + LENGTHS, dtype=torch.int32).cumsum(0).to(torch.int32)
    assert q.numel() <= BUDGET  # the per-token tensors fit: only score tensors can exceed it

    with LargestTensor() as forward:
        out = attn_ref.flash_attn_varlen_func(
            q, k, v, cu_seqlens, cu_seqlens, max(LENGTHS), max(LENGTHS), causal=True
        )
    with LargestTensor() as backward:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)

    for name, seen in (("forward", forward), ("backward", backward)):
        assert BUDGET // 2 < seen.numel <= BUDGET, (name, seen.numel, seen.shape, seen.op)
    # the small tiles compute the right numbers: the last sequence against the dense formula
    last = slice(total - LENGTHS[-1], total)
    leaves64 = [x.detach()[None, last].double().requires_grad_() for x in (q, k, v)]
    out64, _ = dense.attention(*leaves64, causal=True)
    grads64 = torch.autograd.grad(out64, leaves64, dout[None, last].double())
    for got, want in zip((out, dq, dk, dv), (out64, *grads64)):
        torch.testing.assert_close(got[last].double(), want[0], rtol=1e-4, atol=1e-5)
