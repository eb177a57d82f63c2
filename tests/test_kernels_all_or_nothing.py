"""A kernel call that fails leaves the caches bit for bit as they were (:mod:`kernels.kvcache`,
"All or nothing").

Each launch of a call is made to fail in turn: ``Launch.run`` is patched to raise at the ``i``-th
launch, before it runs or after it has written everything (an error, or ``KeyboardInterrupt``).
Whatever fails, the caches must hold their old bits afterwards, garbage (NaN patterns) in the slots
the append overwrites included, and the failure must reach the caller. Covered: the kvcache API
(unsplit, split with its combine launch, paged with rotary and packed new tokens, every cache
dtype), the merge and combine entry points, and the sequence-parallel kernel backend (ring and
Ulysses, whose local attention and merges are these launches).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from attn_ref.validation import check_kvcache_args
from kernels import sequence_parallel as ksp
from kernels.kvcache import plan_kvcache
from kernels.launch import Launch
from kvcache_cases import FP8_SKIP, HAS_FP8, KERNELS, make_case

FP8 = torch.float8_e4m3fn

#: name -> (make_case arguments, call options): the launch sequences of an appending call (with and
#: without the combine launch), contiguous and paged caches, rotary, packed tokens, every dtype.
CALLS = {
    "decode_split_combine_fp16": (
        dict(dtype=torch.float16, batch=1, seqlen_q=1, seqlen_new=1, capacity=12, sinks=True),
        dict(num_splits=3),
    ),
    "paged_rotary_packed_new_bf16": (
        dict(
            dtype=torch.bfloat16,
            seqlen_q=2,
            seqlen_new=2,
            capacity=8,
            page_size=4,
            rotary_dim=16,
            varlen_new=True,
            causal=True,
        ),
        dict(num_splits=1),
    ),
    "leftpad_batch_idx_varlen_q_fp32": (
        dict(seqlen_q=2, seqlen_new=2, capacity=8, leftpad=True, batch_idx=True, varlen_q=True),
        dict(num_splits=1),
    ),
    "fp8_descale_rotary": (
        dict(dtype=FP8, batch=1, seqlen_q=1, seqlen_new=1, capacity=6, rotary_dim=16, descale=True),
        dict(num_splits=1),
    ),
}


class InjectedFailure(Exception):
    """The failure the patched launcher raises."""


def fail_at(monkeypatch, index: int, after: bool, failure: BaseException) -> list[str]:
    """Patch ``Launch.run`` to raise ``failure`` at launch ``index`` (0-based), before running it
    or after; returns the list the kernel names of the launches get appended to."""
    real_run, launched = Launch.run, []

    def run(self):
        launched.append(self.kernel.__name__)
        if len(launched) - 1 == index:
            if after:
                real_run(self)
            raise failure
        real_run(self)

    monkeypatch.setattr(Launch, "run", run)
    return launched


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().view(torch.uint8).cpu().clone()


def garbage_caches(args: dict) -> dict:
    """Random bits (NaN patterns too) in both caches, as an uninitialised cache holds; returns
    their bits."""
    generator = torch.Generator().manual_seed(1)
    for name in ("k_cache", "v_cache"):
        raw = args[name].view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    return {name: bits(args[name]) for name in ("k_cache", "v_cache")}


def launches_of(args: dict, options: dict) -> list[str]:
    """The kernel names a call runs, in order (on a copy of its caches)."""
    args = dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())
    with pytest.MonkeyPatch.context() as patch:
        launched = fail_at(patch, -1, False, InjectedFailure())
        kernels.flash_attn_with_kvcache(**args, **options)
    return launched


def failure_cases() -> list:
    return [
        pytest.param(
            case,
            options,
            id=name,
            marks=[pytest.mark.skipif(case.get("dtype") == FP8 and not HAS_FP8, reason=FP8_SKIP)],
        )
        for name, (case, options) in CALLS.items()
    ]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter, on garbage caches
@pytest.mark.parametrize("case, options", failure_cases())
def test_a_failing_launch_leaves_the_caches_unchanged(monkeypatch, case, options):
    args = KERNELS.placed(make_case(**case))
    before = garbage_caches(args)
    launched = launches_of(args, options)
    assert launched[:2] == ["_append_kv_entry_kernel"] * 2  # the backup, then the append
    # every launch fails in turn (the backup first: it writes no cache), before and after it ran
    for index in range(len(launched)):
        for after in (False, True):
            with monkeypatch.context() as patch:
                fail_at(patch, index, after, InjectedFailure())
                with pytest.raises(InjectedFailure):
                    kernels.flash_attn_with_kvcache(**args, **options)
            for name, old in before.items():
                assert torch.equal(bits(args[name]), old), (name, launched[index], after)
    # and the call, run through, still appends: the restore did not leave a stale backup behind
    kernels.flash_attn_with_kvcache(**args, **options)
    assert not torch.equal(bits(args["v_cache"]), before["v_cache"])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_keyboard_interrupt_in_the_attention_restores_the_caches(monkeypatch):
    case, options = CALLS["decode_split_combine_fp16"]
    args = KERNELS.placed(make_case(**case))
    before = garbage_caches(args)
    fail_at(monkeypatch, 2, True, KeyboardInterrupt())  # backup, append, attention (after it ran)
    with pytest.raises(KeyboardInterrupt):
        kernels.flash_attn_with_kvcache(**args, **options)
    assert all(torch.equal(bits(args[name]), old) for name, old in before.items())


def test_a_failing_restore_is_reported_with_the_failure(monkeypatch):
    """A restore that fails too (it cannot, short of a device fault) is named in a note of the
    original failure, which still propagates."""
    case, options = CALLS["paged_rotary_packed_new_bf16"]
    args = KERNELS.placed(make_case(**case))
    real_run, launched = Launch.run, []

    def run(self):
        launched.append(self.kernel.__name__)
        if len(launched) >= 3:  # the attention, then the restore
            raise InjectedFailure(f"launch {len(launched)}")
        real_run(self)

    monkeypatch.setattr(Launch, "run", run)
    with pytest.raises(InjectedFailure, match="launch 3") as info:
        kernels.flash_attn_with_kvcache(**args, **options)
    assert launched[3] == "_append_kv_entry_kernel"
    assert any("could not be restored" in note for note in info.value.__notes__)


def unspecialised(kernel) -> set[str]:
    """The ``do_not_specialize`` parameters of a ``@triton.jit`` kernel (compiled or
    interpreted)."""
    if hasattr(kernel, "params"):
        return {p.name for p in kernel.params if p.do_not_specialize}
    return set(kernel.kwargs.get("do_not_specialize", ()))


def test_the_restore_is_the_backups_compiled_variant():
    """``save`` and ``restore`` are one launch but for the ``save`` flag, which Triton does not
    specialise: the same compiled variant, so once the backup has run, the restore compiles
    nothing; its tensors (the backup buffers) exist before the first cache write."""
    for name in ("decode_split_combine_fp16", "paged_rotary_packed_new_bf16"):
        case, options = CALLS[name]
        save, restore = plan_kvcache(check_kvcache_args(**make_case(**case), **options)).backup
        same = ("kernel", "grid", "constexprs", "num_warps", "num_stages")
        assert all(getattr(save, field) == getattr(restore, field) for field in same)
        assert save.args.keys() == restore.args.keys()
        assert all(save.args[k] is restore.args[k] for k in save.args if k != "save")
        assert (save.args["save"], restore.args["save"]) == (1, 0)
        assert "save" in unspecialised(save.kernel)


def test_calls_without_new_tokens_plan_no_backup():
    args = make_case(seqlen_q=2, capacity=8)
    assert args.get("k") is None
    assert plan_kvcache(check_kvcache_args(**args)).backup is None


# --------------------------------------------------------------------------------------------------
# The merge and combine entry points, and the sequence-parallel kernel backend
# --------------------------------------------------------------------------------------------------


def _states(n: int):
    generator = torch.Generator().manual_seed(2)
    out = torch.randn(n, 2, 3, 4, 16, generator=generator)  # (n, b, s, h, d)
    lse = torch.randn(n, 2, 3, 4, generator=generator)  # (n, b, s, h)
    return KERNELS.placed(dict(out=out, lse=lse))


MERGES = {
    "merge_attention_states": lambda s, out: kernels.merge_attention_states(
        s["out"][0], s["lse"][0], s["out"][1], s["lse"][1]
    ),
    "combine_attention_states": lambda s, out: kernels.combine_attention_states(s["out"], s["lse"]),
    "flash_attn_combine": lambda s, out: kernels.flash_attn_combine(s["out"], s["lse"], out=out),
}


@pytest.mark.parametrize("entry", MERGES)
def test_a_failing_merge_leaves_its_arguments_unchanged(monkeypatch, entry):
    states = _states(3)
    out = torch.full_like(states["out"][0], 7.0)
    before = [bits(x) for x in (states["out"], states["lse"], out)]
    for after in (False, True):
        with monkeypatch.context() as patch:
            fail_at(patch, 0, after, InjectedFailure())
            with pytest.raises(InjectedFailure):
                MERGES[entry](states, out)
        assert all(
            torch.equal(bits(x), old) for x, old in zip((states["out"], states["lse"], out), before)
        )


SP_CALLS = {
    "ring_causal": lambda q, k, v: ksp.ring_attention(q, k, v, causal=True),
    "ulysses_replicated_suffix": lambda q, k, v: ksp.UlyssesAttention(4, 16, 2)(
        q, k, v, replicated_q=q[:, :2], replicated_k=k[:, :2], replicated_v=v[:, :2]
    ),
}


@pytest.mark.parametrize("scheme", SP_CALLS)
def test_a_failing_sequence_parallel_launch_leaves_the_inputs_unchanged(monkeypatch, scheme):
    generator = torch.Generator().manual_seed(3)
    q, k, v = (
        KERNELS.placed({"x": torch.randn(1, 6, heads, 16, generator=generator)})["x"]
        for heads in (4, 2, 2)
    )
    before = [bits(x) for x in (q, k, v)]
    with monkeypatch.context() as patch:
        launched = fail_at(patch, -1, False, InjectedFailure())
        SP_CALLS[scheme](q, k, v)
    assert "_split_states_kernel" in launched
    for index in range(len(launched)):
        for after in (False, True):
            with monkeypatch.context() as patch:
                fail_at(patch, index, after, InjectedFailure())
                with pytest.raises(InjectedFailure):
                    SP_CALLS[scheme](q, k, v)
            assert all(torch.equal(bits(x), old) for x, old in zip((q, k, v), before)), (
                launched[index],
                after,
            )
