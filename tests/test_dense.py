"""The dense formula (:mod:`attn_ref.dense`), the specification the tiled reference optimises.

* :func:`attn_ref.dense.visible` is the masks' definition, checked against a loop over it.
* The tiled reference, :func:`attn_ref.attention.attention_with_lse`, computes the dense formula:
  every mask and their combinations, ``s_q`` above, below and equal to ``s_k``, decode, no keys,
  softcap, sinks, GQA, ``qv`` and ``only_qv``, and across its tile edges (few rows per tile, a
  small bound on the score elements).
* A row that sees nothing, and the compute dtype.
* ``torch.autograd`` differentiates the dense formula in float64 (``gradcheck``), masks, softcap
  and sinks included: the backward tests' reference gradients rest on it.
"""

from __future__ import annotations

import random

import pytest
import torch

import attn_ref.attention
from attn_ref import dense


def visible_by_definition(sq, sk, causal, window_size, attention_chunk):
    """The masks of ``docs/concepts/masks.md``, key by key: row ``i`` sits at
    ``pos = i + s_k - s_q``; a window side of -1 is unbounded, causal is ``j <= pos``, a chunk is
    ``j // c == pos // c``."""
    left, right = window_size
    rows = []
    for i in range(sq):
        pos = i + sk - sq
        rows.append(
            [
                (left < 0 or j - pos >= -left)
                and (right < 0 or j - pos <= right)
                and (not causal or j <= pos)
                and (attention_chunk <= 0 or j // attention_chunk == pos // attention_chunk)
                for j in range(sk)
            ]
        )
    return torch.tensor(rows, dtype=torch.bool).view(sq, sk)


def test_visible_is_the_definition():
    rng = random.Random(0)
    for _ in range(400):
        sq, sk = rng.randrange(0, 9), rng.randrange(0, 11)
        causal = rng.random() < 0.5
        window = (rng.choice([-1, 0, 1, 2, 5]), rng.choice([-1, 0, 1, 3]))
        chunk = rng.choice([0, 0, 1, 2, 3, 4])
        expected = visible_by_definition(sq, sk, causal, window, chunk)
        assert torch.equal(dense.visible(sq, sk, causal, window, chunk), expected), (
            sq,
            sk,
            causal,
            window,
            chunk,
        )


#: The keywords of :class:`attn_ref.AttentionMask`, which the tiled reference takes as one object.
MASK_OPTIONS = ("causal", "window_size", "attention_chunk")


def tiled(q, k, v, qv=None, only_qv=False, **options):
    """:func:`attn_ref.attention.attention_with_lse` in :func:`attn_ref.dense.attention`'s layout,
    for a batch of one sequence: ``(out (1, s_q, h, d_v), lse (1, h, s_q))``."""
    mask = attn_ref.AttentionMask(
        **{key: options.pop(key) for key in MASK_OPTIONS if key in options}
    )
    out, lse = attn_ref.attention.attention_with_lse(
        q[0], k[0], v[0], mask=mask, qv=None if qv is None else qv[0], only_qv=only_qv, **options
    )
    return out[None], lse.T[None]  # lse: (s_q, h) -> (1, h, s_q)


def problem(sq, sk, h=4, h_k=2, d=16, dv=8, qv=False, only_qv=False, sinks=False, seed=0):
    """fp32 ``(q, k, v)`` of one sequence (a batch of one), and the options ``qv``, ``only_qv``,
    ``sinks``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, sq, h, d, generator=gen)
    k, v = torch.randn(1, sk, h_k, d, generator=gen), torch.randn(1, sk, h_k, dv, generator=gen)
    options = dict(only_qv=True) if only_qv else {}
    if qv or only_qv:
        options["qv"] = torch.randn(1, sq, h, dv, generator=gen)
    if sinks:
        options["sinks"] = torch.randn(h, generator=gen)
    return q, k, v, options


def assert_tiled_is_dense(q, k, v, softmax_scale=0.3, only_qv=False, **options):
    """The tiled reference (fp32) against the dense formula in float64 on the same inputs
    (``only_qv``: the dense formula's ``q`` is None)."""
    out, lse = tiled(q, k, v, softmax_scale=softmax_scale, only_qv=only_qv, **options)
    as64 = {key: x.double() if isinstance(x, torch.Tensor) else x for key, x in options.items()}
    ref_out, ref_lse = dense.attention(
        None if only_qv else q.double(), k.double(), v.double(), softmax_scale, **as64
    )
    assert ref_out.dtype == ref_lse.dtype == torch.float64
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=2e-6)


MASKS = {
    "none": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(2, 1)),
    "window-left": dict(window_size=(3, -1)),
    "window-right": dict(window_size=(-1, 2)),
    "window-zero": dict(window_size=(0, 0)),
    "chunk": dict(attention_chunk=3),
    "causal-window": dict(causal=True, window_size=(2, 5)),
    "causal-chunk": dict(causal=True, attention_chunk=4),
    "window-chunk": dict(window_size=(1, 1), attention_chunk=3),
    "all": dict(causal=True, window_size=(4, -1), attention_chunk=5),
}
SIZES = [(5, 9), (9, 5), (7, 7), (1, 7), (1, 1), (4, 0)]  # (s_q, s_k)


@pytest.mark.parametrize("sq, sk", SIZES, ids=[f"sq{sq}-sk{sk}" for sq, sk in SIZES])
@pytest.mark.parametrize("masks", MASKS.values(), ids=MASKS.keys())
def test_tiled_reference_is_the_dense_formula_under_every_mask(masks, sq, sk):
    q, k, v, _ = problem(sq, sk)
    assert_tiled_is_dense(q, k, v, **masks)


#: (shape and inputs of :func:`problem`, options of the call)
FEATURES = {
    "softcap": (dict(), dict(softcap=1.5)),
    "sinks": (dict(sinks=True), dict()),
    "mha": (dict(h_k=4), dict()),
    "mqa": (dict(h_k=1), dict()),
    "qv": (dict(qv=True), dict()),
    "only_qv": (dict(only_qv=True), dict()),
    "all": (dict(sinks=True, qv=True, h_k=1), dict(softcap=2.0)),
}
FEATURE_MASKS = {
    "none": {},
    "causal": dict(causal=True),
    "causal-window-chunk": dict(causal=True, window_size=(2, 0), attention_chunk=4),
}


@pytest.mark.parametrize("masks", FEATURE_MASKS.values(), ids=FEATURE_MASKS.keys())
@pytest.mark.parametrize("feature", FEATURES.values(), ids=FEATURES.keys())
@pytest.mark.parametrize("sq, sk", [(5, 9), (9, 5)], ids=["sq5-sk9", "sq9-sk5"])
def test_tiled_reference_is_the_dense_formula_with_every_feature(feature, masks, sq, sk):
    shape, options = feature
    q, k, v, inputs = problem(sq, sk, **shape, seed=1)
    assert_tiled_is_dense(q, k, v, **inputs, **options, **masks)


TILE_MASKS = {
    "none": {},
    "causal-window": dict(causal=True, window_size=(9, 3)),
    "chunk": dict(attention_chunk=16),
}


@pytest.mark.parametrize(
    "rows_per_tile, max_score_elements", [(64, 1 << 26), (4, 1 << 26), (64, 50), (3, 1)]
)
@pytest.mark.parametrize("masks", TILE_MASKS.values(), ids=TILE_MASKS.keys())
def test_tiled_reference_is_the_dense_formula_across_tile_edges(
    monkeypatch, rows_per_tile, max_score_elements, masks
):
    monkeypatch.setattr(attn_ref.attention, "ROWS_PER_TILE", rows_per_tile)
    monkeypatch.setattr(attn_ref.attention, "MAX_SCORE_ELEMENTS", max_score_elements)
    q, k, v, inputs = problem(70, 83, sinks=True, seed=2)  # 70 rows: more than one tile of 64
    assert_tiled_is_dense(q, k, v, **inputs, softcap=3.0, **masks)


def test_a_row_that_sees_nothing_gives_zero_and_minus_infinity_or_the_sink():
    q, k, v, inputs = problem(6, 3, sinks=True)  # causal: rows 0..2 sit before the first key
    out, lse = dense.attention(q, k, v, causal=True)
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    assert torch.equal(lse[..., :3], torch.full_like(lse[..., :3], float("-inf")))
    assert torch.isfinite(out).all() and torch.isfinite(lse[..., 3:]).all()
    out, lse = dense.attention(q, k, v, causal=True, **inputs)
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    torch.testing.assert_close(lse[..., :3], inputs["sinks"][None, :, None].expand(1, 4, 3))


def test_compute_dtype_is_at_least_fp32():
    q, k, v, _ = problem(3, 5)
    for dtype, compute in [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ]:
        out, lse = dense.attention(q.to(dtype), k.to(dtype), v.to(dtype))
        assert out.dtype == lse.dtype == compute, dtype
        out, lse = dense.attention(q.to(dtype), k.to(dtype), v.to(dtype), upcast=False)
        assert out.dtype == dtype and lse.dtype == compute, dtype  # the inputs' own dtype


GRADCHECK_CASES = {
    "causal-window-softcap-sinks": dict(causal=True, window_size=(2, -1), softcap=1.5),
    "window-chunk-sinks-qv": dict(window_size=(1, 1), attention_chunk=4, qv=True),
}


@pytest.mark.parametrize("options", GRADCHECK_CASES.values(), ids=GRADCHECK_CASES.keys())
def test_autograd_differentiates_the_dense_formula(options):
    """float64 ``gradcheck`` of ``out`` and ``lse`` with respect to q, k, v, sinks (and qv)."""
    options = dict(options)
    gen = torch.Generator().manual_seed(3)
    b, sq, sk, h, h_k, d, dv = 2, 4, 6, 4, 2, 3, 2
    leaves = [
        torch.randn(b, sq, h, d, generator=gen),
        torch.randn(b, sk, h_k, d, generator=gen),
        torch.randn(b, sk, h_k, dv, generator=gen),
        torch.randn(h, generator=gen),
    ]
    if options.pop("qv", False):
        leaves.append(torch.randn(b, sq, h, dv, generator=gen))
    leaves = [x.double().requires_grad_() for x in leaves]

    def attend(q, k, v, sinks, qv=None):
        return dense.attention(q, k, v, 0.7, sinks=sinks, qv=qv, **options)

    assert torch.autograd.gradcheck(attend, leaves)
