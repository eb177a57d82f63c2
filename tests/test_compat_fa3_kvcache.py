"""Drop-in compatibility with FlashAttention-3's own ``test_flash_attn_kvcache``.

The inputs are built the way FA3's hopper test builds them (with ``batch=3`` instead of FA3's 5, to
fit the kernels' interpreter runs into the CI budget): ``nheads=6`` with
``nheads_k`` 6 / 1 / 3 (MHA / MQA / GQA), head dim 128, cache lengths drawn so that the new tokens
fit, ``cache_leftpad`` below ``cache_seqlens``, cache rows picked from a cache twice as large with
``cache_batch_idx``, paged caches of ``ceil(seqlen_k / P) * b_cache * 3`` shuffled pages, the local
window as a 2-element int tensor ``torch.randint(0, seqlen_k, (2,))``, a random ``attention_chunk``
with causal/local masks, rotary tables of random angles, and ``rotary_seqlens`` passed on **every**
call (the very ``cache_seqlens`` tensor, or ``cache_seqlens // 2``), also without rotary tables.

FA3's grid (dtype x MHA/MQA/GQA x seqlen pairs x causal/local x new_kv x rotary fraction and
layout x page size x leftpad x batch_idx x varlen q x num_splits ...) has tens of thousands of
points; :func:`covering_cases` picks a deterministic subset that still contains every *pair* of
levels of any two factors (a pairwise covering array, built greedily with a fixed seed). Each
case runs on both implementations and is checked against the dense oracle with FA's tolerance
rule, the LSE tightly, and the caches after the append (:func:`dense_oracle.assert_matches_oracle`).

The second half checks FA3's behaviour for arguments it ignores or normalises: every such call
gives bit for bit the result of its plain equivalent.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

import attn_ref
from dense_oracle import assert_matches_oracle
from kvcache_cases import base, clone_args, rotary, run_kernels

I32 = torch.int32
BATCH, NHEADS, HEAD_DIM = 3, 6, 128

#: FA3's factors and their levels (``page_size`` None = contiguous cache).
FACTORS = {
    "dtype": [torch.bfloat16, torch.float16, torch.float8_e4m3fn],
    "mha_type": ["mha", "mqa", "gqa"],
    "seqlens": [(1, 128), (3, 1024), (64, 256)],
    "mask": ["none", "causal", "local"],
    "chunk": [False, True],
    "new_kv": [False, True],
    "new_eq_q": [True, False],
    "rotary_fraction": [0.0, 0.5, 1.0],
    "interleaved": [False, True],
    "rotary_seqlens_half": [False, True],
    "page_size": [None, 1, 4, 128],
    "leftpad": [False, True],
    "batch_idx": [False, True],
    "varlen_q": [False, True],
    "num_splits": [1, 3, 0],
}


def valid(case: dict) -> bool:
    """FA3's skips: rotary needs new k/v, ``cache_seqlens // 2`` only with rotary, chunks only with
    a causal or local mask (the page sizes all divide the chosen ``seqlen_k``)."""
    return (
        (case["rotary_fraction"] == 0 or case["new_kv"])
        and (case["rotary_fraction"] > 0 or not case["rotary_seqlens_half"])
        and (case["mask"] != "none" or not case["chunk"])
    )


def covering_cases(factors: dict, seed: int = 0, candidates: int = 40) -> list[dict]:
    """A deterministic pairwise covering array of ``factors`` under :func:`valid` (greedy: each new
    case is the candidate, among random completions of one still-uncovered pair, covering most
    uncovered pairs)."""
    rng = random.Random(seed)
    names = list(factors)

    def completion(fixed: dict):
        for _ in range(200):
            case = {n: fixed[n] if n in fixed else rng.choice(factors[n]) for n in names}
            if valid(case):
                return case
        return None

    def pairs(case):
        return {
            ((a, repr(case[a])), (b, repr(case[b]))) for a, b in itertools.combinations(names, 2)
        }

    uncovered = set()
    for a, b in itertools.combinations(names, 2):
        for la, lb in itertools.product(factors[a], factors[b]):
            if completion({a: la, b: lb}) is not None:
                uncovered.add(((a, repr(la)), (b, repr(lb))))
    level = {(n, repr(x)): x for n in names for x in factors[n]}
    cases = []
    while uncovered:
        (a, la), (b, lb) = sorted(uncovered)[0]
        options = [completion({a: level[(a, la)], b: level[(b, lb)]}) for _ in range(candidates)]
        best = max((c for c in options if c is not None), key=lambda c: len(pairs(c) & uncovered))
        uncovered -= pairs(best)
        cases.append(best)
    return cases


def fa3_style_call(case: dict, seed: int) -> tuple[dict, int]:
    """Keyword arguments of one call built as FA3's ``test_flash_attn_kvcache`` builds them, and the
    call's ``num_splits``."""
    gen = torch.Generator().manual_seed(seed)
    dtype = case["dtype"]
    fp8 = dtype == torch.float8_e4m3fn
    low = torch.bfloat16 if fp8 else dtype  # FA3 draws fp8 inputs in bf16, then converts
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(low).to(dtype)  # noqa: E731
    randint = lambda lo, hi, n: torch.randint(lo, hi, (n,), generator=gen)  # noqa: E731  [lo, hi)
    b, h = BATCH, NHEADS
    h_k = {"mha": h, "mqa": 1, "gqa": 3}[case["mha_type"]]
    seqlen_q, seqlen_k = case["seqlens"]
    causal, local = case["mask"] == "causal", case["mask"] == "local"
    rotary_dim = math.floor(int(case["rotary_fraction"] * HEAD_DIM) / 16) * 16
    new_kv = case["new_kv"]
    seqlen_new = seqlen_q if case["new_eq_q"] else int(randint(1, seqlen_q + 1, 1))

    seqlens_q = randint(1, seqlen_q + 1, b).tolist() if case["varlen_q"] else [seqlen_q] * b
    seqlens_new = (
        (seqlens_q if case["new_eq_q"] else randint(1, seqlen_new + 1, b).tolist())
        if case["varlen_q"]
        else [seqlen_new] * b
    )
    hi = (
        seqlen_k - (seqlen_q if (causal or local) and rotary_dim else seqlen_new) + 1
        if new_kv
        else seqlen_k + 1
    )
    cache_seqlens = randint(0 if new_kv else 1, hi, b).to(I32)
    args = dict(cache_seqlens=cache_seqlens, causal=causal)
    args["rotary_seqlens"] = cache_seqlens // 2 if case["rotary_seqlens_half"] else cache_seqlens
    if case["leftpad"]:
        args["cache_leftpad"] = torch.tensor(
            [int(randint(0, c, 1)) if c > 0 else 0 for c in cache_seqlens.tolist()], dtype=I32
        )
    if local:
        args["window_size"] = torch.randint(0, seqlen_k, (2,), generator=gen)
    if case["chunk"]:
        args["attention_chunk"] = int(randint(1, 2 * seqlen_k, 1))

    if case["varlen_q"]:
        args["q"] = randn(sum(seqlens_q), h, HEAD_DIM)
        args["cu_seqlens_q"] = torch.tensor([0, *itertools.accumulate(seqlens_q)], dtype=I32)
        args["max_seqlen_q"] = seqlen_q
    else:
        args["q"] = randn(b, seqlen_q, h, HEAD_DIM)
    b_cache = 2 * b if case["batch_idx"] else b
    if case["batch_idx"]:
        args["cache_batch_idx"] = torch.randperm(b_cache, generator=gen)[:b].to(I32)
    page_size = case["page_size"]
    if page_size is None:
        rows = (b_cache, seqlen_k)
        table_rows = seqlen_k
    else:
        num_blocks = math.ceil(seqlen_k / page_size) * b_cache * 3
        args["page_table"] = torch.randperm(num_blocks, generator=gen).to(I32).view(b_cache, -1)
        rows = (num_blocks, page_size)
        table_rows = num_blocks * page_size
    args["k_cache"], args["v_cache"] = randn(*rows, h_k, HEAD_DIM), randn(*rows, h_k, HEAD_DIM)
    if new_kv:
        if case["varlen_q"]:
            args["k"], args["v"] = (
                randn(sum(seqlens_new), h_k, HEAD_DIM),
                randn(sum(seqlens_new), h_k, HEAD_DIM),
            )
            args["cu_seqlens_k_new"] = torch.tensor(
                [0, *itertools.accumulate(seqlens_new)], dtype=I32
            )
        else:
            args["k"], args["v"] = (
                randn(b, seqlen_new, h_k, HEAD_DIM),
                randn(b, seqlen_new, h_k, HEAD_DIM),
            )
    if rotary_dim:
        angles = torch.rand(table_rows, rotary_dim // 2, generator=gen) * 2 * math.pi
        args["rotary_cos"], args["rotary_sin"] = angles.cos().to(low), angles.sin().to(low)
        args["rotary_interleaved"] = case["interleaved"]
    return args, case["num_splits"]


CASES = covering_cases(FACTORS)


def case_id(i: int, case: dict) -> str:
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}[
        case["dtype"]
    ]
    sq, sk = case["seqlens"]
    chunk = "+chunk" if case["chunk"] else ""
    return (
        f"{i}-{dtype}-{case['mha_type']}-{sq}x{sk}-{case['mask']}{chunk}"
        f"-new{int(case['new_kv'])}-ro{case['rotary_fraction']}-P{case['page_size']}"
        f"-splits{case['num_splits']}"
    )


def test_covering_array_covers_every_pair():
    # Every feasible pair of levels appears in some case, and every case is a call FA3 runs.
    names = list(FACTORS)
    seen = {
        ((a, repr(c[a])), (b, repr(c[b])))
        for c in CASES
        for a, b in itertools.combinations(names, 2)
    }
    for a, b in itertools.combinations(names, 2):
        for la, lb in itertools.product(FACTORS[a], FACTORS[b]):
            feasible = any(valid({**c, a: la, b: lb}) for c in CASES)
            assert not feasible or ((a, repr(la)), (b, repr(lb))) in seen, (a, la, b, lb)
    assert all(valid(c) for c in CASES) and len(CASES) <= 30


IMPLEMENTATIONS = {"attn_ref": attn_ref.flash_attn_with_kvcache, "kernels": run_kernels}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
@pytest.mark.parametrize(
    "index, case", list(enumerate(CASES)), ids=[case_id(i, c) for i, c in enumerate(CASES)]
)
def test_fa3_kvcache_grid(impl, index, case):
    args, num_splits = fa3_style_call(case, seed=index)
    assert_matches_oracle(impl, args, num_splits=num_splits)


# --------------------------------------------------------------------------------------------------
# Arguments FA3 ignores or normalises: the same result as the plain call, bit for bit.
# --------------------------------------------------------------------------------------------------


def _drop(args, *names):
    return {key: val for key, val in args.items() if key not in names}


def _varlen_new(args):
    """The base call with its new k/v packed (cu_seqlens_k_new)."""
    return dict(
        args,
        k=args["k"].flatten(0, 1),
        v=args["v"].flatten(0, 1),
        cu_seqlens_k_new=torch.tensor([0, 2, 4], dtype=I32),
    )


EQUIVALENT = {
    # FA3 reads these only together with something that is not given
    "rotary_seqlens_without_tables": (
        lambda a: dict(a, rotary_seqlens=torch.tensor([7, 0], dtype=I32)),
        lambda a: a,
    ),
    "rotary_seqlens_is_cache_seqlens": (
        lambda a: dict(rotary(a), rotary_seqlens=a["cache_seqlens"]),
        rotary,
    ),
    "rotary_sin_without_cos": (lambda a: dict(a, rotary_sin=torch.zeros(16, 8)), lambda a: a),
    "v_without_k": (lambda a: _drop(a, "k"), lambda a: _drop(a, "k", "v")),
    "cu_seqlens_k_new_without_k": (
        lambda a: dict(_drop(a, "k", "v"), cu_seqlens_k_new=torch.tensor([0, 1, 2], dtype=I32)),
        lambda a: _drop(a, "k", "v"),
    ),
    "descales_without_fp8": (
        lambda a: dict(a, q_descale=torch.full((2, 2), 3.0), k_descale=torch.ones(7)),
        lambda a: a,
    ),
    "longer_cache_batch_idx": (
        lambda a: dict(
            a,
            cache_batch_idx=torch.tensor([1, 0, 1, 1], dtype=I32),
            k_cache=a["k_cache"].flip(0),
            v_cache=a["v_cache"].flip(0),
        ),
        lambda a: dict(
            a,
            cache_batch_idx=torch.tensor([1, 0], dtype=I32),
            k_cache=a["k_cache"].flip(0),
            v_cache=a["v_cache"].flip(0),
        ),
    ),
    # window_size: FA3 indexes [0] and [1]; a negative side is unbounded, and so is a side at least
    # as long as the static lengths
    "window_list": (lambda a: dict(a, window_size=[2, 0]), lambda a: dict(a, window_size=(2, 0))),
    "window_tensor": (
        lambda a: dict(a, window_size=torch.tensor([2, 0])),
        lambda a: dict(a, window_size=(2, 0)),
    ),
    "window_three_entries": (
        lambda a: dict(a, window_size=(2, 0, 5)),
        lambda a: dict(a, window_size=(2, 0)),
    ),
    "window_below_minus_one": (
        lambda a: dict(a, window_size=(-2, -7)),
        lambda a: dict(a, window_size=(-1, -1)),
    ),
    "window_huge": (
        lambda a: dict(a, window_size=(2**62, 2**62)),
        lambda a: dict(a, window_size=(-1, -1)),
    ),
    "window_right_huge_causal": (
        lambda a: dict(a, window_size=(1, 2**40), causal=True),
        lambda a: dict(a, window_size=(1, 0), causal=True),
    ),
    # attention_chunk: sglang's int(); <= 0 is off; a chunk beyond every length is one chunk
    "chunk_negative": (
        lambda a: dict(a, attention_chunk=-4),
        lambda a: dict(a, attention_chunk=None),
    ),
    "chunk_float": (lambda a: dict(a, attention_chunk=3.7), lambda a: dict(a, attention_chunk=3)),
    "chunk_tensor": (
        lambda a: dict(a, attention_chunk=torch.tensor(3)),
        lambda a: dict(a, attention_chunk=3),
    ),
    "chunk_huge": (
        lambda a: dict(a, attention_chunk=2**62, causal=True),
        lambda a: dict(a, attention_chunk=64, causal=True),
    ),
    # softcap: FA3's softcap > 0 test; the value is used in float32
    "softcap_negative": (lambda a: dict(a, softcap=-1.0), lambda a: dict(a, softcap=0.0)),
    "softcap_nan": (lambda a: dict(a, softcap=float("nan")), lambda a: dict(a, softcap=0.0)),
    "softcap_below_float32": (lambda a: dict(a, softcap=1e-50), lambda a: dict(a, softcap=0.0)),
    # plain Python / numpy numbers where FA3 takes them
    "softmax_scale_int": (lambda a: dict(a, softmax_scale=1), lambda a: dict(a, softmax_scale=1.0)),
    "num_splits_negative": (lambda a: dict(a, num_splits=-3), lambda a: dict(a, num_splits=0)),
    "flags_as_numpy_int_and_tensor": (
        lambda a: dict(a, causal=np.bool_(True), rotary_interleaved=torch.tensor(1)),
        lambda a: dict(a, causal=True),
    ),
    "only_qv_none": (lambda a: dict(a, only_qv=None), lambda a: a),  # sglang tests only its truth
    # the same new tokens, packed
    "packed_new_kv": (_varlen_new, lambda a: a),
}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
@pytest.mark.parametrize("change, plain", EQUIVALENT.values(), ids=EQUIVALENT.keys())
def test_ignored_and_normalised_arguments(impl, change, plain):
    changed, expected = change(base()), plain(base())
    result = impl(**changed, return_softmax_lse=True)
    reference = impl(**expected, return_softmax_lse=True)
    for got, want in zip(result, reference):
        assert (got is None and want is None) or torch.equal(got, want)
    for name in ("k_cache", "v_cache"):
        assert torch.equal(changed[name], expected[name]), name


def test_rotary_seqlens_same_tensor_as_cache_seqlens_is_not_modified():
    args = rotary(base())
    args["rotary_seqlens"] = args["cache_seqlens"]
    before = args["cache_seqlens"].clone()
    attn_ref.flash_attn_with_kvcache(**clone_args(args))
    assert torch.equal(args["cache_seqlens"], before)
