"""Code written for ring-flash-attention, sglang and torch.distributed runs unchanged, and bad calls
fail alike.

Single-process part: the ring-flash-attention entry points on one rank, sglang's constructor
arguments, ``skip_sequence_parallel``, the messages and check order, the launcher's arguments and
the cross-rank error's text.

Multi-rank part (one gloo spawn of 2 and one of 4 ranks, module-scoped): the plain
ring-flash-attention call **without a group argument** gets the world answer (contiguous and zigzag,
causal and not, the packed variants, both implementations), ``group=None`` means the world for
every collective, and ranks that disagree (dtype, sequence length, heads, replicated count, group
layout, one rank's bad argument, different calls) all get the same catalogued error, after which
the group still works (no rank aborted).
"""

from __future__ import annotations

import re
import zlib

import pytest
import torch
import torch.distributed as dist

import attn_ref
from attn_ref import sequence_parallel as sp
from attn_ref.sequence_parallel import agreement
from attn_ref.sequence_parallel.launch import _as_rank_failure
from sp_cases import _attention, _attention_lowp
from tolerance import assert_close_fa, assert_lse_close

D = 16
SPAWN_TIMEOUT_S = 480
RFA_VARIANTS = ("func", "kvpacked", "qkvpacked")
DISAGREE = r"the ranks of the sequence-parallel group disagree on "


def _qkv(b=1, s=8, h=4, hkv=2, d=D, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, s, n, d, generator=gen).to(dtype) for n in (h, hkv, hkv))


def call_rfa(api, variant: str, zigzag: bool, q, k, v, **kwargs):
    """``[zigzag_]ring_flash_attn[_kvpacked|_qkvpacked]_func`` of ``api`` on q, k, v, packed as
    upstream."""
    name = (
        ("zigzag_" if zigzag else "")
        + "ring_flash_attn_"
        + ("" if variant == "func" else variant + "_")
        + "func"
    )
    fn = getattr(api, name)
    if variant == "qkvpacked":
        return fn(torch.stack([q, k, v], dim=2), **kwargs)  # [B, S, 3, H, D]
    if variant == "kvpacked":
        return fn(q, torch.stack([k, v], dim=2), **kwargs)  # [B, S, 2, Hkv, D]
    return fn(q, k, v, **kwargs)


# --------------------------------------------------------------------------------------------------
# One process
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", RFA_VARIANTS)
@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_flash_attn_on_one_rank_is_local_attention(variant, zigzag, causal):
    hkv = 4 if variant == "qkvpacked" else 2
    q, k, v = _qkv(hkv=hkv)
    out_ref, lse_ref = _attention(q, k, v, causal)
    out = call_rfa(sp, variant, zigzag, q, k, v, causal=causal)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, out_ref)
    out, lse, probs = call_rfa(sp, variant, zigzag, q, k, v, causal=causal, return_attn_probs=True)
    assert probs is None and lse.dtype == torch.float32 and lse.shape == (1, 4, 8)  # [B, H, S]
    torch.testing.assert_close(lse, lse_ref.transpose(1, 2))


def test_ring_flash_attn_takes_upstream_positional_arguments():
    q, k, v = _qkv()
    # (q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
    # return_attn_probs, group)
    out, lse, _ = sp.ring_flash_attn_func(q, k, v, 0.0, 0.5, True, (-1, -1), None, True, True, None)
    ref = attn_ref.flash_attn_with_kvcache(
        q, k, v, softmax_scale=0.5, causal=True, return_softmax_lse=True
    )
    torch.testing.assert_close((out, lse), tuple(ref[:2]))


@pytest.mark.parametrize("window", [(-1, 0), (7, -1), (100, 100)])
def test_windows_that_mask_nothing_beyond_causal_are_honoured(window):
    q, k, v = _qkv()
    # FlashAttention's causal window; the others cover the whole sequence of 8
    causal = window == (-1, 0)
    out = sp.ring_flash_attn_func(q, k, v, window_size=window)
    torch.testing.assert_close(out, _attention(q, k, v, causal)[0])


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (
            lambda q, k, v: sp.ring_flash_attn_func(q, k, v, dropout_p=0.1),
            NotImplementedError,
            "dropout_p=0.1 is not supported: attention dropout is not implemented",
        ),
        (
            lambda q, k, v: sp.ring_flash_attn_func(q, k, v, alibi_slopes=torch.ones(4)),
            NotImplementedError,
            "alibi_slopes is not supported by the ring (ring-flash-attention asserts alibi_slopes "
            "is None)",
        ),
        # upstream's order: the ALiBi assert comes first
        (
            lambda q, k, v: sp.ring_flash_attn_func(q, k, v, 0.5, alibi_slopes=torch.ones(4)),
            NotImplementedError,
            "alibi_slopes is not supported",
        ),
        (
            lambda q, k, v: sp.ring_flash_attn_func(q, k, v, window_size=(2, 0)),
            NotImplementedError,
            "window_size=(2, 0) is not supported by the ring: a sliding window over the global "
            "sequence of 8 tokens",
        ),
        (
            lambda q, k, v: sp.ring_flash_attn_func(q, k, v, window_size=(-1, 3)),
            NotImplementedError,
            "window_size=(-1, 3) is not supported by the ring",
        ),
        (
            lambda q, k, v: sp.ring_flash_attn_func(q, k, v, window_size=-1),
            TypeError,
            "window_size must be a pair of ints (left, right), got -1",
        ),
        (
            lambda q, k, v: sp.ring_flash_attn_kvpacked_func(q, k),
            ValueError,
            "kv must be a [batch, seq, 2, heads, head_dim] tensor, got shape (1, 8, 2, 16)",
        ),
        # the packed layout is read before the ALiBi assert, as upstream indexes qkv[:, :, 0] first
        (
            lambda q, k, v: sp.ring_flash_attn_qkvpacked_func(q, alibi_slopes=torch.ones(4)),
            ValueError,
            "qkv must be a [batch, seq, 3, heads, head_dim] tensor, got shape (1, 8, 4, 16)",
        ),
        (
            lambda q, k, v: sp.zigzag_ring_flash_attn_func(
                q[:, :7], k[:, :7], v[:, :7], causal=True
            ),
            ValueError,
            "the zigzag layout needs an even number of rows per ring block (q's local sequence "
            "length), got 7",
        ),
        (lambda q, k, v: sp.ring_flash_attn_func(q[0], k, v), ValueError, "Expected 4D tensors"),
    ],
)
def test_ring_flash_attn_refusals(call, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        call(*_qkv())


def test_expected_4d_is_sglangs_text_exactly():
    q, k, v = _qkv()
    for call in (
        lambda: sp.UlyssesAttention(4, D, 2)(q[0], k, v),
        lambda: sp.ring_attention(q, k, v[0]),
    ):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == "Expected 4D tensors"


def test_constructors_take_sglangs_arguments_in_order():
    backends = {"FA"}
    ulysses = sp.UlyssesAttention(
        4, D, 2, None, True, backends, "blocks.0.attn", sp_attention_mode="auto", some_impl_option=3
    )
    assert ulysses.supported_attention_backends is backends and ulysses.prefix == "blocks.0.attn"
    assert ulysses.extra_impl_args == {"some_impl_option": 3} and ulysses.causal
    usp = sp.USPAttention(
        4,
        D,
        2,
        0.5,
        True,
        backends,
        "blocks.0.attn",
        0.0,
        True,
        zigzag=True,
        enable_packed_qkv_input_a2a=False,
        is_cross_attention=True,
    )
    assert (
        usp.skip_sequence_parallel
        and usp.dropout_p == 0.0
        and usp.softmax_scale == 0.5
        and usp.zigzag
    )
    assert usp.extra_impl_args == {"enable_packed_qkv_input_a2a": False, "is_cross_attention": True}


@pytest.mark.parametrize("rate", [0.1, "0.1"])
def test_usp_dropout_rate_is_refused(rate):
    with pytest.raises(
        NotImplementedError, match=re.escape(f"dropout_rate={rate!r} is not supported")
    ):
        sp.USPAttention(4, D, dropout_rate=rate)


@pytest.mark.parametrize("causal", [False, True])
def test_skip_sequence_parallel_attends_the_replicated_kv_locally(causal):
    q, _, _ = _qkv(s=8)
    _, k, v = _qkv(s=5, seed=1)  # encoder K/V: another length
    expected = _attention(q, k, v, causal)
    torch.testing.assert_close(
        sp.USPAttention(4, D, 2, causal=causal, skip_sequence_parallel=True)(q, k, v), expected[0]
    )
    out, lse = sp.USPAttention(4, D, 2, causal=causal)(
        q, k, v, None, 0, 0, 0, True, return_softmax_lse=True
    )
    torch.testing.assert_close((out, lse), expected)
    with pytest.raises(
        ValueError,
        match=re.escape("k and v must have the same sequence length (dim 1), got 5 and 4"),
    ):
        sp.USPAttention(4, D, 2, skip_sequence_parallel=True)(q, k, v[:, :4])


@pytest.mark.parametrize(
    "timeout_s, message",
    [
        (
            float("inf"),
            "timeout_s must be at most 10000000 seconds (the launcher needs a finite limit), got "
            "inf",
        ),
        (1e12, "timeout_s must be at most 10000000 seconds"),
        (float("nan"), "timeout_s must be a number of seconds > 0, got nan"),
        (True, "timeout_s must be a number of seconds > 0, got True"),
        (-1.0, "timeout_s must be a number of seconds > 0, got -1.0"),
    ],
)
def test_launch_refuses_out_of_range_timeouts(timeout_s, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sp.launch(print, 2, timeout_s=timeout_s)


@pytest.mark.parametrize("ending", [SystemExit(0), KeyboardInterrupt()])
def test_a_ranks_exit_is_reported_as_that_ranks_failure(ending):
    error = _as_rank_failure(ending, rank=1, world_size=4)
    assert isinstance(error, ChildProcessError) and error.__cause__ is ending
    assert str(error).startswith(f"rank 1 of 4 ended with {type(ending).__name__}")
    plain = ValueError("bad")
    assert _as_rank_failure(plain, 1, 4) is plain  # an Exception is the rank's error itself


def test_disagreement_message_names_the_first_field_that_differs():
    summaries = [
        ("f", {"q": ((1, 8), "torch.float32"), "causal": True}, None),
        ("f", {"q": ((1, 8), "torch.float16"), "causal": False}, "ValueError: x"),
    ]
    with pytest.raises(ValueError) as info:
        agreement.check_ranks_agree(summaries)
    assert str(info.value) == (
        "the ranks of the sequence-parallel group disagree on q (rank 0: ((1, 8), "
        "'torch.float32'), rank 1: ((1, 8), 'torch.float16')); every rank must make the same call "
        "(same dtypes, shapes, heads, replicated counts and group layout)"
    )
    agreement.check_ranks_agree([summaries[0], summaries[0]])  # agreeing ranks: nothing to raise


def test_without_torch_distributed_group_none_is_this_rank():
    x = torch.randn(1, 4, 2, 2)
    assert not dist.is_initialized()
    assert sp.all_gather(x, 1) is x and sp.all_to_all_4d(x) is x
    exchange = sp.RingExchange()
    assert torch.equal(exchange.start(x), x)
    exchange.wait()


# --------------------------------------------------------------------------------------------------
# Across ranks
# --------------------------------------------------------------------------------------------------


def _rfa_cases(world: int) -> list[tuple[str, bool, bool, str]]:
    """(variant, zigzag, causal, dtype) of the plain ring-flash-attention calls of a ``world``-rank
    run."""
    cases = [
        (variant, zigzag, causal, "float32")
        for variant in RFA_VARIANTS
        for zigzag in (False, True)
        for causal in (False, True)
    ]
    return cases + [("func", True, True, "bfloat16"), ("kvpacked", False, True, "float16")]


KERNEL_CASES = [("func", False, True, "float32"), ("qkvpacked", True, True, "float32")]


def _rfa_case(
    api, world: int, rank: int, variant: str, zigzag: bool, causal: bool, dtype: str
) -> dict:
    """This rank's rows of a plain ring-flash-attention call (no group argument) and the world
    answer's."""
    seed = zlib.crc32(f"{variant}{zigzag}{causal}{dtype}".encode())
    hkv = 4 if variant == "qkvpacked" else 2
    # the whole sequence
    q, k, v = _qkv(b=2, s=8 * world, hkv=hkv, dtype=getattr(torch, dtype), seed=seed)
    rows = sp.shard_positions(q.shape[1], rank, 1, world, zigzag)
    out, lse, _ = call_rfa(
        api,
        variant,
        zigzag,
        q[:, rows],
        k[:, rows],
        v[:, rows],
        causal=causal,
        return_attn_probs=True,
    )
    plain = call_rfa(api, variant, zigzag, q[:, rows], k[:, rows], v[:, rows], causal=causal)
    out_ref, lse_ref = _attention(q.float(), k.float(), v.float(), causal)
    return dict(
        out=out,
        lse=lse,
        plain=plain,
        out_ref=out_ref[:, rows],
        lse_ref=lse_ref[:, rows].transpose(1, 2),
        out_lowp=_attention_lowp(q, k, v, causal)[:, rows],
    )


def _default_group_collectives(world: int, rank: int) -> dict:
    """all_gather, all_to_all_4d and RingExchange with no group argument: the whole world."""
    x = rank * 100 + torch.arange(2 * 2 * world * 3, dtype=torch.float32).reshape(
        1, 2, 2 * world, 3
    )
    exchange = sp.RingExchange()
    received = exchange.start(x)
    exchange.wait()
    return dict(x=x, gathered=sp.all_gather(x, dim=1), heads=sp.all_to_all_4d(x), received=received)


def _packed_kv(qkv):
    q, k, v = qkv
    return q, torch.stack([k, v], dim=2)


def _disagreements(world: int, rank: int) -> dict:
    """Calls in which rank 0 differs from the others; every rank reports ``(type, message)``."""
    first = rank == 0
    layouts = {(u, r): sp.init_sequence_parallel_groups(u, r) for u, r in ((world, 1), (1, world))}
    if world == 4:
        layouts[(2, 2)] = sp.init_sequence_parallel_groups(2, 2)
    q, k, v = _qkv()
    calls = {
        "dtype": lambda: sp.ring_flash_attn_func(
            q.half() if first else q, k.half() if first else k, v.half() if first else v
        ),
        "sequence length": lambda: sp.ring_attention(*_qkv(s=6 if first else 8)),
        "head dim": lambda: sp.ring_flash_attn_kvpacked_func(
            *_packed_kv(_qkv(d=8 if first else D))
        ),
        "heads": lambda: sp.USPAttention(8 if first else 4, D, 2)(*_qkv(h=8 if first else 4)),
        "replicated count": lambda: sp.USPAttention(4, D, 2, groups=layouts[(1, world)])(
            q, k, v, num_replicated_prefix=1 if first else 2
        ),
        "group layout": lambda: sp.USPAttention(
            4, D, 2, groups=layouts[(1, world) if first else (world, 1)]
        )(q, k, v),
        "one rank's bad argument": lambda: sp.zigzag_ring_flash_attn_func(
            q[0] if first else q, k, v, causal=True
        ),
        "different calls": lambda: (
            sp.ring_attention(q, k, v) if first else sp.ring_flash_attn_func(q, k, v)
        ),
        "the same bad call": lambda: sp.ring_flash_attn_func(q, k, v, dropout_p=0.5),
    }
    if world == 4:
        calls["group layout 2x2 vs 4x1"] = lambda: sp.USPAttention(
            4, D, 2, groups=layouts[(2, 2) if rank < 2 else (4, 1)]
        )(q, k, v)
    report = {}
    for name, call in calls.items():
        try:
            call()
            report[name] = None
        # reported to the parent, which checks type and text
        except Exception as exc:  # noqa: BLE001
            report[name] = (type(exc), str(exc))
    return report


DISAGREEMENT_FIELDS = {
    "dtype": "q",
    "sequence length": "q",
    "head dim": "q",
    "heads": "heads",
    "replicated count": "counts",
    "group layout": "layout",
    "one rank's bad argument": "q",
    "different calls": "the call",
    "group layout 2x2 vs 4x1": "layout",
}


def run_dropin_rank(world: int) -> dict:
    """Body of every rank: the plain calls (both implementations), the collectives, the
    disagreements."""
    import kernels.sequence_parallel as kernel_sp

    rank = dist.get_rank()
    report = {
        "rfa": {case: _rfa_case(sp, world, rank, *case) for case in _rfa_cases(world)},
        "collectives": _default_group_collectives(world, rank),
        "disagreements": _disagreements(world, rank),
    }
    if world == 2:
        report["rfa_kernels"] = {
            case: _rfa_case(kernel_sp, world, rank, *case) for case in KERNEL_CASES
        }
    # After every refused call the group still works: one more plain call on every rank.
    report["after"] = sp.ring_flash_attn_func(*_qkv(seed=rank))
    return report


@pytest.fixture(scope="module")
def ranks(request):
    return {
        world: sp.launch(run_dropin_rank, world, (world,), timeout_s=SPAWN_TIMEOUT_S)
        for world in (2, 4)
    }


def _check_rfa(reports: list[dict], key: str, case) -> None:
    for report in reports:
        r = report[key][case]
        assert torch.equal(r["plain"], r["out"])  # return_attn_probs only adds the LSE
        assert r["out"].dtype == r["out_lowp"].dtype
        assert_close_fa(r["out"], r["out_ref"], r["out_lowp"])
        assert_lse_close(r["lse"], r["lse_ref"])


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world", [2, 4])
def test_plain_ring_flash_attn_call_gets_the_world_answer(ranks, world):
    for case in _rfa_cases(world):
        _check_rfa(ranks[world], "rfa", case)


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
def test_plain_ring_flash_attn_call_on_the_kernels(ranks):
    for case in KERNEL_CASES:
        _check_rfa(ranks[2], "rfa_kernels", case)


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world", [2, 4])
def test_group_none_is_the_world_for_every_collective(ranks, world):
    views = [r["collectives"] for r in ranks[world]]
    for rank, view in enumerate(views):
        hp = 2  # heads per rank: 2·world heads over world ranks
        assert torch.equal(view["gathered"], torch.cat([x["x"] for x in views], 1))
        assert torch.equal(
            view["heads"], torch.cat([x["x"][:, :, rank * hp : (rank + 1) * hp] for x in views], 1)
        )
        assert torch.equal(view["received"], views[(rank - 1) % world]["x"])


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_that_disagree_all_get_the_same_error(ranks, world):
    reports = [r["disagreements"] for r in ranks[world]]
    for name in reports[0]:
        outcomes = {report[name] for report in reports}
        assert len(outcomes) == 1, f"{name}: the ranks raised different errors: {outcomes}"
        got = outcomes.pop()
        assert got is not None, f"{name}: nothing raised"
        exc_type, message = got
        if name == "the same bad call":
            assert exc_type is NotImplementedError and message.startswith(
                "dropout_p=0.5 is not supported"
            )
            continue
        assert exc_type is ValueError and message.startswith(
            DISAGREE + DISAGREEMENT_FIELDS[name] + " ("
        ), message
        assert f"rank {world - 1}: " in message
    for report in ranks[world]:  # no rank aborted, and the group still works
        assert report["after"].shape == (1, 8, 4, D)
