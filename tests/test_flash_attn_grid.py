"""FA3's entry points on the reference, on FlashAttention's own test grid, sampled for a CPU.

The two parametrisations of ``hopper/test_flash_attn.py`` (FlashAttention's repository) that these
entry points answer to, written again here:

* ``test_flash_attn_output``: :func:`attn_ref.flash_attn_func` (and, where ``s_q == s_k``,
  :func:`attn_ref.flash_attn_qkvpacked_func`) over FA's ``(seqlen_q, seqlen_k)`` list, with its
  factors: MHA / GQA / MQA (6 query heads over 6, 2 or 1 KV heads), causal, a random sliding
  window, a random ``attention_chunk``, softcap 15 (q scaled by ``softcap / 4`` so that the logits
  reach the cap), fp16 / bf16, ``d_v != d``.
* ``test_flash_attn_varlen_output``: :func:`attn_ref.flash_attn_varlen_func` on FA's random padding
  masks (each sequence ``max(1, s - 20) .. s`` long; the keys' masks with zero-length sequences
  every fifth entry and last) turned into ``cu_seqlens`` by unpadding, and with "unused" tokens
  (a second random mask: the sequences hold the union, ``seqused_q`` / ``seqused_k`` count the
  intersection), plus sglang's ``sinks``.

FA runs every combination; here each seqlen pair takes a few combinations drawn with a fixed seed
(the test ids name them), and the long pairs ``(1023, 1024)``, ``(2048, 2048)``
(``flash_attn_func``) and ``(1024, 1023)`` (varlen) run once each with 2 query heads over 1 KV
head. The gradients are those of ``Σ out·dout + Σ lse·dlse`` (the LSE's use too). The expected
values are float64 autograd of the dense formula (``flash_attn_cases.expected`` on
:func:`attn_ref.dense.attention`, one sequence at a time for varlen); the rule is FA's
(``tests/tolerance.py``): the error of the output and of each gradient at most twice (3x with
softcap) that of the dense formula computed in the input dtype (FA's ``upcast=False,
reorder_ops=True`` baseline), plus twice the dtype's rounding noise at the values' magnitude (FA's
``fwd_atol`` / ``dq_atol``; with softcap FA adds ``3e-4`` to the gradients' term). The LSE is fp32
and compared tightly. Rows past ``seqused_q`` must give exactly ``out = 0``, ``lse = -inf`` and
zero gradients, and unused keys zero gradients (FA masks them before comparing; the reference
defines them).
"""

from __future__ import annotations

import itertools
import random
from typing import NamedTuple

import pytest
import torch

import attn_ref
from flash_attn_cases import I32, cu_seqlens, expected, padding_lengths
from tolerance import assert_close_fa, assert_lse_close, rounding_atol

#: FA's ``test_flash_attn_output`` pairs, a sample of those a CPU runs in a fraction of a second.
FUNC_SEQLENS = [
    (1, 1),
    (64, 128),
    (256, 256),
    (239, 1),
    (799, 3),
    (113, 203),
    (128, 217),
    (640, 128),
]
#: FA's ``test_flash_attn_varlen_output`` pairs, likewise.
VARLEN_SEQLENS = [(1, 1), (1, 3), (2, 1), (511, 1), (3, 513), (113, 203), (307, 256), (640, 128)]
#: The long pairs of FA's lists: once each, 2 query heads over 1 KV head.
LONG_SEQLENS = [(1023, 1024), (2048, 2048), (1024, 1023)]
#: Combinations drawn per short seqlen pair.
DRAWS = 2
#: FA's softcap value.
SOFTCAP = 15.0


class Case(NamedTuple):
    """One drawn combination of FA's factors."""

    seqlen_q: int
    seqlen_k: int
    heads: str  # "mha", "gqa" or "mqa"
    causal: bool
    local: bool
    chunk: bool  # a random attention_chunk in [1, 2 s_k), as FA draws it
    softcap: bool
    dtype: torch.dtype
    d: int
    dv: int

    def __str__(self) -> str:
        flags = [
            name
            for name, on in (
                ("causal", self.causal),
                ("local", self.local),
                ("chunk", self.chunk),
                ("softcap", self.softcap),
            )
            if on
        ]
        dtype = str(self.dtype).removeprefix("torch.")
        return "-".join(
            [f"{self.seqlen_q}x{self.seqlen_k}", self.heads, *flags, dtype, f"d{self.d}v{self.dv}"]
        )


def _draw(seqlens: list[tuple[int, int]], seed: int) -> list[Case]:
    """``DRAWS`` combinations of FA's factors per seqlen pair, drawn with a fixed seed."""
    rng = random.Random(seed)
    factors = list(
        itertools.product(
            ("mha", "gqa", "mqa"),
            (False, True),  # causal
            (False, True),  # local
            (False, True),  # chunk
            (False, True),  # softcap
            (torch.bfloat16, torch.float16),
            ((64, 64), (32, 64), (96, 96)),  # (d, d_v): FA's d and its d_v != d
        )
    )
    cases = []
    for sq, sk in seqlens:
        for heads, causal, local, chunk, softcap, dtype, (d, dv) in rng.sample(factors, DRAWS):
            cases.append(Case(sq, sk, heads, causal, local, chunk, softcap, dtype, d, dv))
    return cases


def _heads(case: Case) -> tuple[int, int]:
    """FA's 6 query heads over 6 / 2 / 1 KV heads; 2 over 1 for the long pairs."""
    if (case.seqlen_q, case.seqlen_k) in LONG_SEQLENS:
        return 2, 1
    return 6, {"mha": 6, "gqa": 2, "mqa": 1}[case.heads]


def _options(case: Case, gen: torch.Generator) -> dict:
    """The mask and softcap options, drawn as FA draws them: the window's two sides uniform in
    ``[0, s_k)`` (the right side is 0 with causal), the chunk uniform in ``[1, 2 s_k)``."""
    sk = case.seqlen_k
    options: dict = {"causal": case.causal}
    if case.local:
        options["window_size"] = tuple(torch.randint(0, sk, (2,), generator=gen).tolist())
    if case.chunk:
        options["attention_chunk"] = torch.randint(1, 2 * sk, (), generator=gen).item()
    if case.softcap:
        options["softcap"] = SOFTCAP
    return options


def _inputs(case: Case, batch: int, gen: torch.Generator):
    """Padded ``q (b, s_q, h, d)``, ``k (b, s_k, h_k, d)``, ``v (b, s_k, h_k, d_v)`` in the case's
    dtype, q scaled by ``softcap / 4`` with softcap (FA's rule: logits in the cap's range)."""
    h, h_k = _heads(case)
    q = torch.randn(batch, case.seqlen_q, h, case.d, generator=gen)
    if case.softcap:
        q = q * (SOFTCAP / 4)
    k = torch.randn(batch, case.seqlen_k, h_k, case.d, generator=gen)
    v = torch.randn(batch, case.seqlen_k, h_k, case.dv, generator=gen)
    return tuple(x.to(case.dtype) for x in (q, k, v))


def _assert_fa_rule(got, expected64, baseline, softcap: bool, gradient: bool, what: str):
    """FA's rule on one tensor: at most 2x (3x with softcap) the baseline's error plus 2x the
    dtype's rounding noise at the values' magnitude (plus ``3e-4`` for a gradient with softcap)."""
    atol = rounding_atol(expected64.to(got.dtype)) + (3e-4 if softcap and gradient else 0.0)
    try:
        assert_close_fa(got, expected64, baseline, atol=atol, softcap=softcap)
    except AssertionError as error:
        raise AssertionError(f"{what}: {error}") from None


FUNC_CASES = _draw(FUNC_SEQLENS, seed=3) + [
    Case(*LONG_SEQLENS[0], "mqa", True, False, False, True, torch.bfloat16, 32, 32),
    Case(*LONG_SEQLENS[1], "mqa", False, True, True, False, torch.float32, 32, 32),
]


@pytest.mark.parametrize("case", FUNC_CASES, ids=str)
def test_flash_attn_output(case: Case):
    """FA's ``test_flash_attn_output``: the output, LSE and gradients of q, k and v (of
    ``Σ out·dout + Σ lse·dlse``). Where ``s_q == s_k`` and ``d == d_v`` the same call goes through
    ``flash_attn_qkvpacked_func`` (the 4-D GQA layout when ``h_k < h``), whose ``qkv`` gradient
    holds the three."""
    gen = torch.Generator().manual_seed(case.seqlen_q * 1009 + case.seqlen_k)
    batch = 1 if (case.seqlen_q, case.seqlen_k) in LONG_SEQLENS else 2
    q, k, v = _inputs(case, batch, gen)
    options = _options(case, gen)
    (b, sq, h), h_k = q.shape[:3], k.shape[2]
    dout = torch.randn(b, sq, h, case.dv, generator=gen).to(case.dtype)
    dlse = torch.randn(b, h, sq, generator=gen)
    if case.seqlen_q == case.seqlen_k and case.d == case.dv:
        layout = {} if h == h_k else {"num_heads_q": h}
        qkv = (torch.stack((q, k, v), dim=2) if h == h_k else torch.cat((q, k, v), 2)).clone()
        qkv.requires_grad_()
        out, lse = attn_ref.flash_attn_qkvpacked_func(
            qkv, **options, **layout, return_attn_probs=True
        )
        (dqkv,) = torch.autograd.grad(_loss(out, lse, dout, dlse), qkv)
        grads = dqkv.unbind(2) if h == h_k else dqkv.split([h, h_k, h_k], dim=2)
    else:
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = attn_ref.flash_attn_func(*leaves, **options, return_attn_probs=True)
        grads = torch.autograd.grad(_loss(out, lse, dout, dlse), leaves)
    assert out.dtype == case.dtype and lse.dtype == torch.float32
    out64, lse64, grads64, out_low, grads_low = expected(q, k, v, dout, dlse, **options)
    _assert_fa_rule(out, out64, out_low, case.softcap, False, "out")
    assert_lse_close(lse, lse64.float())
    for name, grad, grad64, grad_low in zip(("dq", "dk", "dv"), grads, grads64, grads_low):
        assert grad.dtype == case.dtype, name
        _assert_fa_rule(grad, grad64, grad_low, case.softcap, True, name)


def _loss(out, lse, dout, dlse):
    """``Σ out·dout + Σ lse·dlse``, the rows with ``lse = -inf`` (no key) left out of the second
    sum, as :func:`flash_attn_cases.expected` leaves them out."""
    return (out.float() * dout.float()).sum() + (lse.nan_to_num(0, 0, 0) * dlse).sum()


def _lengths(max_seqlen: int, batch: int, gen, zero_lengths: bool, add_unused: bool):
    """``(stored, used)`` lengths of FA's random padding masks (:func:`padding_lengths`, FA's
    ``generate_random_padding_mask``); with ``add_unused`` (FA's ``add_unused_qkv``) a second
    random mask: the sequences hold the union of the two prefix masks, only their intersection
    takes part (``seqused``)."""
    lengths = padding_lengths(batch, max_seqlen, gen, zero_lengths)
    if not add_unused:
        return lengths, lengths
    other = padding_lengths(batch, max_seqlen, gen)
    return [max(a, b) for a, b in zip(lengths, other)], [min(a, b) for a, b in zip(lengths, other)]


def _unpad(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """FA's ``unpad_input``: the first ``lengths[i]`` tokens of each entry of padded ``x (b, s,
    ...)``, packed ``(Σ lengths, ...)``."""
    return torch.cat([x[i, :n] for i, n in enumerate(lengths)])


def _varlen_param(case: Case, add_unused: bool, sinks: bool):
    flags = ["unused"] * add_unused + ["sinks"] * sinks
    return pytest.param(case, add_unused, sinks, id="-".join([str(case), *flags]))


#: ``(case, add_unused, sinks)``: the drawn cases take the four ``(add_unused, sinks)`` pairs in
#: turn.
VARLEN_CASES = [
    _varlen_param(case, n % 2 == 1, n % 4 in (0, 3))
    for n, case in enumerate(_draw(VARLEN_SEQLENS, seed=5))
] + [
    _varlen_param(
        Case(*LONG_SEQLENS[2], "mqa", False, True, False, False, torch.float16, 32, 32), True, True
    ),
]


@pytest.mark.parametrize("case, add_unused, sinks", VARLEN_CASES)
def test_flash_attn_varlen_output(case: Case, add_unused: bool, sinks: bool):
    """FA's ``test_flash_attn_varlen_output`` (padding masks unpadded into ``cu_seqlens``, unused
    tokens as ``seqused``), plus sglang's ``sinks`` and their gradient, and the LSE's use."""
    gen = torch.Generator().manual_seed(case.seqlen_q + 7 * case.seqlen_k + add_unused)
    batch = 2 if (case.seqlen_q, case.seqlen_k) in LONG_SEQLENS else 5
    q, k, v = _inputs(case, batch, gen)
    options = _options(case, gen)
    h = q.shape[2]
    sink_values = torch.randn(h, generator=gen) if sinks else None
    stored_q, used_q = _lengths(case.seqlen_q, batch, gen, False, add_unused)
    stored_k, used_k = _lengths(case.seqlen_k, batch, gen, True, add_unused)
    cu_q, cu_k = cu_seqlens(stored_q), cu_seqlens(stored_k)
    seqused = (
        dict(seqused_q=torch.tensor(used_q, dtype=I32), seqused_k=torch.tensor(used_k, dtype=I32))
        if add_unused
        else {}
    )
    inputs = [_unpad(q, stored_q), _unpad(k, stored_k), _unpad(v, stored_k)]
    inputs += [sink_values] if sinks else []
    leaves = [x.clone().requires_grad_() for x in inputs]
    out, lse, *rest = attn_ref.flash_attn_varlen_func(
        *leaves[:3],
        cu_q,
        cu_k,
        max(stored_q),
        max(stored_k),
        **seqused,
        **options,
        sinks=leaves[3] if sinks else None,
        return_softmax_lse=True,
    )
    total_q = sum(stored_q)
    assert rest == [None, None] and out.dtype == case.dtype and lse.shape == (h, total_q)
    dout = torch.randn(out.shape, generator=gen).to(case.dtype)
    dlse = torch.randn(h, total_q, generator=gen)
    grads = torch.autograd.grad(_loss(out, lse, dout, dlse), leaves)

    # The expected packed results: each sequence's used rows and keys attended on their own.
    names = ["out", "dq", "dk", "dv"] + ["dsinks"] * sinks
    expected64 = {
        name: torch.zeros(x.shape, dtype=torch.float64) for name, x in zip(names, [out, *inputs])
    }
    baseline = {name: torch.zeros_like(x, dtype=case.dtype) for name, x in expected64.items()}
    lse64 = torch.full((h, total_q), float("-inf"))
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    for i in range(batch):
        rows = slice(starts_q[i], starts_q[i] + used_q[i])
        keys = slice(starts_k[i], starts_k[i] + used_k[i])
        # rows past seqused_q and keys past seqused_k: exactly zero
        unused_rows, unused_keys = (
            slice(rows.stop, starts_q[i + 1]),
            slice(keys.stop, starts_k[i + 1]),
        )
        assert not out[unused_rows].any() and (lse[:, unused_rows] == float("-inf")).all()
        assert not grads[0][unused_rows].any()
        assert not grads[1][unused_keys].any() and not grads[2][unused_keys].any()
        if used_q[i] == 0:
            continue
        seq = (q[i : i + 1, : used_q[i]], k[i : i + 1, : used_k[i]], v[i : i + 1, : used_k[i]])
        out64, seq_lse64, grads64, out_low, grads_low = expected(
            *seq, dout[None, rows], dlse[None, :, rows], sink_values, **options
        )
        lse64[:, rows] = seq_lse64[0].float()
        for name, place, value64, value_low in zip(
            names, (rows, rows, keys, keys), (out64, *grads64), (out_low, *grads_low)
        ):
            expected64[name][place] = value64[0]
            baseline[name][place] = value_low[0]
        if sinks:
            expected64["dsinks"] += grads64[3]
            baseline["dsinks"] += grads_low[3]
    assert_lse_close(lse, lse64)
    for name, got in zip(names, (out, *grads)):
        _assert_fa_rule(got, expected64[name], baseline[name], case.softcap, name != "out", name)
