"""Deliberately broken ``flash_attn_with_kvcache`` implementations: the reference with one bug each.

The conformance tests (``test_conformance.py``) run the suite against each and check that the
feature in :data:`CAUGHT_BY` fails while ``values/basic`` passes. Every function takes the call's
keyword arguments (the suite calls by keyword) and passes them on to
:func:`attn_ref.flash_attn_with_kvcache` after the bug.
"""

import torch

from attn_ref import flash_attn_with_kvcache as reference


def ignores_softmax_scale(**kw):
    """Always the default scale."""
    kw.pop("softmax_scale", None)
    return reference(**kw)


def causal_off_by_one(**kw):
    """Causal rows see one key past the diagonal."""
    if kw.pop("causal", False):
        kw["window_size"] = (kw.get("window_size", (-1, -1))[0], 1)
    return reference(**kw)


def ignores_leftpad(**kw):
    kw.pop("cache_leftpad", None)
    return reference(**kw)


def appends_past_cache_seqlens(**kw):
    """New tokens written (and attended) one slot after cache_seqlens."""
    if kw.get("k") is not None:
        kw["cache_seqlens"] = kw["cache_seqlens"] + 1
    return reference(**kw)


def split_combine_drops_lse(**kw):
    """With num_splits > 1, the partial outputs are averaged instead of weighted by their LSEs."""
    if kw.get("num_splits", 0) <= 1:
        return reference(**kw)
    out, lse, acc, lacc = reference(**dict(kw, return_softmax_lse=True))
    mean = acc.mean(0)  # (b, h, sq, dv) or (h, total_q, dv)
    out = (mean.transpose(0, 1) if mean.dim() == 3 else mean.transpose(1, 2)).to(out.dtype)
    return (out, lse, acc, lacc) if kw.get("return_softmax_lse") else out


def gqa_heads_swapped(**kw):
    """Query head j reads key/value head j % h_k instead of j // (h / h_k).

    The reference maps query head position p to key/value head p // g, so query head j is computed
    at position p(j) = (j % h_k) * g + j // h_k (the heads permuted in, and the results back out).
    """
    if (
        not isinstance(kw.get("q"), torch.Tensor)
        or not isinstance(kw.get("v_cache"), torch.Tensor)
        or "out" in kw
    ):
        return reference(**kw)
    h, h_k = kw["q"].shape[-2], kw["v_cache"].shape[-2]
    g = h // h_k
    place = torch.tensor([(j % h_k) * g + j // h_k for j in range(h)])
    order = torch.argsort(place)  # head at each position
    for name in ("q", "qv"):
        if kw.get(name) is not None:
            kw[name] = kw[name][..., order, :]
    if kw.get("sinks") is not None:
        kw["sinks"] = kw["sinks"][order]
    result = reference(**dict(kw, return_softmax_lse=True))
    out, lse = result[0][..., place, :], result[1]
    lse = lse[place] if lse.dim() == 2 else lse[:, place]
    return (out, lse, *result[2:]) if kw.get("return_softmax_lse") else out


def ignores_window(**kw):
    kw.pop("window_size", None)
    return reference(**kw)


def ignores_sinks(**kw):
    kw.pop("sinks", None)
    return reference(**kw)


def ignores_chunk(**kw):
    kw.pop("attention_chunk", None)
    return reference(**kw)


def rotary_layout_swapped(**kw):
    """GPT-J where GPT-NeoX was asked for, and the other way round."""
    kw["rotary_interleaved"] = not kw.get("rotary_interleaved", True)
    return reference(**kw)


def ignores_descale(**kw):
    for name in ("q_descale", "k_descale", "v_descale"):
        kw.pop(name, None)
    return reference(**kw)


def ignores_cache_batch_idx(**kw):
    kw.pop("cache_batch_idx", None)
    return reference(**kw)


def qv_scale_without_dv(**kw):
    """The default scale with qv counts only q's head dim."""
    if (
        isinstance(kw.get("q"), torch.Tensor)
        and kw.get("qv") is not None
        and kw.get("softmax_scale") is None
        and not kw.get("only_qv")
    ):
        kw["softmax_scale"] = kw["q"].shape[-1] ** -0.5
    return reference(**kw)


def q_checked_before_k_cache(**kw):
    """sglang's order broken: q=None is reported before k_cache=None."""
    if kw.get("q") is None and not kw.get("only_qv", False) and kw.get("v_cache") is not None:
        raise ValueError("q can only be None when only_qv=True")
    return reference(**kw)


def dirties_cache_on_error(**kw):
    """A failed call leaves a trace in v_cache (as if it appended before it checked)."""
    try:
        return reference(**kw)
    except Exception:
        v_cache = kw.get("v_cache")
        if isinstance(v_cache, torch.Tensor) and v_cache.numel():
            v_cache.view(-1)[0] += 1
        raise


def no_qv(**kw):
    """Raises NotImplementedError for qv (declare ``qv`` and ``only_qv`` unsupported)."""
    if kw.get("qv") is not None:
        raise NotImplementedError("qv is not implemented")
    return reference(**kw)


#: The broken implementations and the feature (or features) that must catch each.
CAUGHT_BY = {
    ignores_softmax_scale: "values/softmax_scale",
    causal_off_by_one: "values/causal",
    ignores_leftpad: "values/leftpad",
    appends_past_cache_seqlens: "in_place/append",
    split_combine_drops_lse: "values/num_splits",
    gqa_heads_swapped: "values/gqa",
    ignores_window: "values/window",
    ignores_sinks: "values/sinks",
    ignores_chunk: "values/chunk",
    rotary_layout_swapped: (
        "values/rotary_interleaved",
        "values/rotary_neox",
        "in_place/append_rotary",
    ),
    ignores_descale: "values/fp8",
    ignores_cache_batch_idx: ("values/cache_batch_idx", "in_place/append_cache_batch_idx"),
    qv_scale_without_dv: "values/qv",
    q_checked_before_k_cache: "errors/sglang_order",
    dirties_cache_on_error: "errors/caches_untouched",
    no_qv: "values/qv",
}
