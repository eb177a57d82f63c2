"""Argument checks of the sequence-parallel package: every error it raises on purpose is raised here.

Two rules make a bad call fail fast instead of hanging a job:

* **Before any collective.** Each entry point runs all its checks first; a rank that raises has not
  entered an all-to-all, all-gather or ring exchange the other ranks would wait in.
* **The same on every rank.** A check reads only what every rank of a well-formed call agrees on:
  shapes, dtypes, head counts, the group degrees, ``seq_lens``. When the ranks of the group are given
  the same kind of call, they all raise the same error. (One rank passing a tensor of a different
  shape than the others cannot be detected without a collective; that call still hangs or fails
  inside torch.distributed.)

Messages follow upstream (sglang's ``layer.py``, ``usp.py`` and ``AllToAll4D``) verbatim where
upstream has one; upstream ``assert`` s and ``RuntimeError`` s on arguments become ``ValueError`` s
here. Checks this package adds run after the upstream ones of the same call.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

#: sglang's text for UlyssesAttention under ring parallelism (raised as NotImplementedError).
ULYSSES_RING_MESSAGE = (
    "UlyssesAttention's all-to-all spans the combined sequence parallel group and is not ring-aware; "
    "it would silently shuffle across ring ranks instead of rotating KV within them. Ring parallelism "
    "is not supported for models still using UlyssesAttention -- use USPAttention instead."
)

SP_ATTENTION_MODES = ("ulysses", "kv_gather", "auto")

#: The longest run :func:`~attn_ref.sequence_parallel.launch` accepts (about 116 days; ``inf`` is refused).
MAX_TIMEOUT_S = 10_000_000


# ---------------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------------


def check_positive_int(name: str, value: object) -> None:
    """``value`` is an int (not a bool) >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_count(name: str, value: object) -> None:
    """``value`` is an int (not a bool) >= 0: a number of replicated tokens."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_head_config(num_heads: object, head_size: object, num_kv_heads: object, softmax_scale: object) -> None:
    """Constructor arguments shared by :class:`UlyssesAttention` and :class:`USPAttention`."""
    check_positive_int("num_heads", num_heads)
    check_positive_int("head_size", head_size)
    check_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise ValueError(f"Query heads ({num_heads}) must be divisible by KV heads ({num_kv_heads}).")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
        if not (math.isfinite(softmax_scale) and softmax_scale > 0):
            raise ValueError(f"softmax_scale must be a finite number > 0 or None, got {softmax_scale}")


# ---------------------------------------------------------------------------------------------------
# Group layout
# ---------------------------------------------------------------------------------------------------


def check_sp_degrees(ulysses_degree: int, ring_degree: int, world_size: int, initialized: bool) -> None:
    """``ulysses_degree x ring_degree`` ranks form one SP group; the world is a whole number of them."""
    check_positive_int("ulysses_degree", ulysses_degree)
    check_positive_int("ring_degree", ring_degree)
    sp_size = ulysses_degree * ring_degree
    if sp_size > 1 and not initialized:
        raise ValueError(
            f"ulysses_degree x ring_degree = {ulysses_degree} x {ring_degree} needs torch.distributed to be "
            "initialized (torch.distributed.init_process_group, or attn_ref.sequence_parallel.launch), "
            "but it is not"
        )
    if world_size % sp_size:
        raise ValueError(
            f"world_size ({world_size}) must be a multiple of ulysses_degree x ring_degree "
            f"({ulysses_degree} x {ring_degree} = {sp_size})"
        )


def check_ulysses_only(ring_degree: int) -> None:
    """UlyssesAttention's all-to-all is not ring-aware (sglang PR #33353)."""
    if ring_degree > 1:
        raise NotImplementedError(ULYSSES_RING_MESSAGE)


def check_sp_attention_mode(mode: object, causal: bool) -> None:
    """``sp_attention_mode`` is known; an explicit K/V gather refuses causal attention (as sglang)."""
    if mode not in SP_ATTENTION_MODES:
        raise ValueError(f"sp_attention_mode must be one of {SP_ATTENTION_MODES}, got {mode!r}")
    if mode == "kv_gather" and causal:
        raise ValueError("K/V-gather SP does not support causal attention.")


# ---------------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------------


def check_seq_lens(seq_lens: Sequence[int], world_size: int) -> list[int]:
    """``seq_lens``: one local sequence length per rank of the group (its values: :func:`check_seq_lens_values`)."""
    if isinstance(seq_lens, torch.Tensor) or not isinstance(seq_lens, (list, tuple)):
        raise TypeError(f"seq_lens must be a list of ints, got {type(seq_lens).__name__}")
    if len(seq_lens) != world_size:
        raise ValueError(f"seq_lens must have length {world_size}, got {len(seq_lens)}")
    return list(seq_lens)


def check_seq_lens_values(seq_lens: list) -> None:
    """Every local length is an int >= 0 (this package's check, after upstream's ``usp.py`` asserts)."""
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in seq_lens):
        raise ValueError(f"seq_lens must hold non-negative ints, got {list(seq_lens)}")


def check_local_seq_len(q: torch.Tensor, seq_lens: list[int], rank: int) -> None:
    """Varlen: this rank's local length is its entry of ``seq_lens`` (usp.py's text)."""
    if q.shape[1] != seq_lens[rank]:
        raise ValueError(f"s_local ({q.shape[1]}) must equal seq_lens[{rank}] ({seq_lens[rank]})")


def check_all_to_all_4d(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, world_size: int, rank: int,
    seq_lens: Optional[Sequence[int]],
) -> None:
    """Upstream's ``AllToAll4D`` asserts (plus the varlen ones of ``usp.py``), in upstream order."""
    if x.dim() != 4:
        raise ValueError(f"input must be 4D tensor, got {x.dim()} and shape {x.shape}")
    if (scatter_dim, gather_dim) not in ((2, 1), (1, 2)):
        raise ValueError(
            f"Invalid scatter_dim={scatter_dim}, gather_dim={gather_dim}. Only (scatter_dim=2, gather_dim=1) "
            "and (scatter_dim=1, gather_dim=2) are supported."
        )
    if seq_lens is not None:
        seq_lens = check_seq_lens(seq_lens, world_size)
    if scatter_dim == 2:  # sequence shards -> head shards
        check_heads_split(x.shape[2], world_size)
        if seq_lens is not None:
            check_local_seq_len(x, seq_lens, rank)
            check_seq_lens_values(seq_lens)
    else:  # head shards -> sequence shards
        seqlen = x.shape[1]
        if seq_lens is not None:
            check_seq_lens_values(seq_lens)
        if seq_lens is None and seqlen % world_size:
            raise ValueError(
                f"sequence dimension ({seqlen}) must be divisible by sequence parallel world size ({world_size})"
            )
        if seq_lens is not None and seqlen != sum(seq_lens):
            raise ValueError(f"s_global ({seqlen}) must equal sum(seq_lens) ({sum(seq_lens)})")


def check_heads_split(hn: int, world_size: int) -> None:
    """``AllToAll4D``'s assert: the heads split evenly over the group (UlyssesAttention's q heads)."""
    if hn % world_size:
        raise ValueError(f"head dimension ({hn}) must be divisible by sequence parallel world size ({world_size})")


def check_usp_heads_split(h_global: int, world_size: int) -> None:
    """``usp.py``'s ``_usp_input_all_to_all`` assert: the heads split evenly over the Ulysses group."""
    if h_global % world_size:
        raise ValueError(f"h_global ({h_global}) must be divisible by world_size ({world_size})")


def check_gather_dim(x: torch.Tensor, dim: int) -> None:
    """Upstream ``GroupCoordinator.all_gather``'s assert."""
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"Invalid dim ({dim}) for input tensor with shape {x.size()}")


def check_ranks_agree(summaries: Sequence[tuple[str, dict, Optional[str]]]) -> None:
    """Every rank of the group made the same call: ``(call, fields, error or None)`` per rank, gathered.

    Names the first thing that differs: the entry point, a field (in the call's order), or the error
    the ranks' own checks raised. Every rank holds the same list, so every rank raises the same error.
    """
    calls, fields, outcomes = zip(*summaries)
    names = list(fields[0]) if len(set(calls)) == 1 else []
    candidates = [("the call", list(calls))]
    candidates += [(name, [f.get(name) for f in fields]) for name in names]
    candidates += [("the outcome of the argument checks", [o or "no error" for o in outcomes])]
    for what, values in candidates:
        if any(value != values[0] for value in values):
            per_rank = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
            raise ValueError(
                f"the ranks of the sequence-parallel group disagree on {what} ({per_rank}); every rank must "
                "make the same call (same dtypes, shapes, heads, replicated counts and group layout)"
            )


# ---------------------------------------------------------------------------------------------------
# Attention inputs
# ---------------------------------------------------------------------------------------------------


def check_tensors(**tensors: object) -> None:
    """Each named argument is a tensor."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_4d(**tensors: torch.Tensor) -> None:
    """Upstream's ``assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "Expected 4D tensors"``."""
    if any(x.dim() != 4 for x in tensors.values()):
        raise ValueError("Expected 4D tensors")


def check_replicated_together(replicated_q, replicated_k, replicated_v) -> bool:
    """All three replicated tensors or none (sglang's K/V-gather text, applied on every path).

    Returns whether replicated tokens were given.
    """
    given = [x is not None for x in (replicated_q, replicated_k, replicated_v)]
    if any(given) and not all(given):
        raise ValueError("Replicated Q, K, and V must be provided together.")
    return all(given)


def check_kv_gather_call(seq_lens, replicated_q, replicated_k, replicated_v) -> bool:
    """sglang ``_forward_with_kv_gather``'s two checks, in its order. Returns whether replicated."""
    if seq_lens is not None:
        raise NotImplementedError("K/V-gather SP does not support varlen UlyssesAttention.")
    return check_replicated_together(replicated_q, replicated_k, replicated_v)


def check_ulysses_call(seq_lens, replicated_q, replicated_k, replicated_v) -> None:
    """The Ulysses path's first check: varlen excludes replicated tokens.

    (The path then checks "all three or none" after the all-to-all's asserts, where sglang asserts
    k/v when ``replicated_q`` is given; sglang silently ignores a lone ``replicated_k``, here any
    partial set raises.)
    """
    if seq_lens is not None and any(x is not None for x in (replicated_q, replicated_k, replicated_v)):
        raise ValueError("Varlen Ulysses attention does not support replicated QKV")


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_extra_rows: int = 0) -> None:
    """q ``[B, S, H, D]``, k ``[B, S + kv_extra_rows, Hkv, D]``, v ``[B, same, Hkv, Dv]``, one dtype/device.

    ``kv_extra_rows`` is the length of a K/V-only replicated prefix (0 otherwise).
    """
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k and v must be float16, bfloat16 or float32, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"q, k and v must have the same batch size (dim 0), got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
        )
    if k.shape[1] != v.shape[1] or k.shape[1] != q.shape[1] + kv_extra_rows:
        extra = f" + {kv_extra_rows} K/V-only prefix rows" if kv_extra_rows else ""
        raise ValueError(
            f"k and v must have q's sequence length{extra} (dim 1): q {q.shape[1]}, k {k.shape[1]}, "
            f"v {v.shape[1]}"
        )
    if k.shape[2] != v.shape[2] or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"k and v must have the same number of heads, dividing q's (dim 2): q {q.shape[2]}, "
            f"k {k.shape[2]}, v {v.shape[2]}"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim (dim 3), got {q.shape[3]} and {k.shape[3]}")


def check_kv_lengths(k: torch.Tensor, v: torch.Tensor) -> None:
    """Cross-attention K/V (any length, every rank holds them whole): k and v have the same rows."""
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same sequence length (dim 1), got {k.shape[1]} and {v.shape[1]}")


def check_packed(name: str, x: torch.Tensor, parts: int) -> None:
    """ring-flash-attention's packed layouts: ``kv [B, S, 2, Hkv, D]``, ``qkv [B, S, 3, H, D]``."""
    if x.dim() != 5 or x.shape[2] != parts:
        raise ValueError(
            f"{name} must be a [batch, seq, {parts}, heads, head_dim] tensor, got shape {tuple(x.shape)}"
        )


def check_no_dropout(name: str, value: object) -> None:
    """Attention dropout is not implemented (the reference is deterministic): only 0 is accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != 0:
        raise NotImplementedError(
            f"{name}={value!r} is not supported: attention dropout is not implemented; pass {name}=0.0 "
            "(inference), or apply dropout outside the attention call"
        )


def check_no_alibi(alibi_slopes: object) -> None:
    """ring-flash-attention asserts ``alibi_slopes is None``; ALiBi biases are not implemented here either."""
    if alibi_slopes is not None:
        raise NotImplementedError(
            "alibi_slopes is not supported by the ring (ring-flash-attention asserts alibi_slopes is None); "
            "pass alibi_slopes=None"
        )


def check_ring_window(window_size: object, causal: bool, seq_len: int) -> bool:
    """``window_size = (left, right)`` as FlashAttention reads it; returns whether the call is causal.

    A negative side is unlimited; FlashAttention treats ``(-1, 0)`` as causal. The ring masks whole
    blocks by their place in the global sequence of ``seq_len`` tokens, so it honours a window only
    where it masks nothing beyond ``causal``: each side unlimited or covering the whole sequence.
    """
    if (
        not isinstance(window_size, (tuple, list)) or len(window_size) != 2
        or any(isinstance(w, bool) or not isinstance(w, int) for w in window_size)
    ):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    # A side covering the whole sequence is unlimited; then FlashAttention's rule for a causal window.
    left, right = (-1 if w >= seq_len - 1 else w for w in window_size)
    causal = bool(causal) or (left < 0 and right == 0)
    if left >= 0 or (not causal and right >= 0):
        raise NotImplementedError(
            f"window_size={tuple(window_size)} is not supported by the ring: a sliding window over the global "
            f"sequence of {seq_len} tokens needs per-token positions across ranks; pass window_size=(-1, -1) "
            "(with causal=True for a causal mask)"
        )
    return causal


def check_declared_heads(q: torch.Tensor, k: torch.Tensor, num_heads: int, num_kv_heads: int, head_size: int) -> None:
    """The tensors match the module's ``num_heads``, ``num_kv_heads`` and ``head_size``."""
    if q.shape[2] != num_heads or k.shape[2] != num_kv_heads:
        raise ValueError(
            f"q must have num_heads={num_heads} and k, v num_kv_heads={num_kv_heads} heads (dim 2), "
            f"got q {q.shape[2]} and k {k.shape[2]}"
        )
    if q.shape[3] != head_size:
        raise ValueError(f"q and k must have head_size={head_size} (dim 3), got {q.shape[3]}")


def check_replicated_shapes(
    replicated_q: torch.Tensor, replicated_k: torch.Tensor, replicated_v: torch.Tensor,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
) -> None:
    """Replicated tokens look like q/k/v apart from their sequence length ``S_r`` (dim 1)."""
    check_tensors(replicated_q=replicated_q, replicated_k=replicated_k, replicated_v=replicated_v)
    check_4d(replicated_q=replicated_q, replicated_k=replicated_k, replicated_v=replicated_v)
    pairs = (("replicated_q", replicated_q, q), ("replicated_k", replicated_k, k), ("replicated_v", replicated_v, v))
    for name, rep, x in pairs:
        if rep.dtype != x.dtype or rep.device != x.device:
            raise ValueError(
                f"{name} must have the dtype and device of {name[-1]} ({x.dtype}, {x.device}), "
                f"got {rep.dtype}, {rep.device}"
            )
        if rep.shape[0] != x.shape[0] or rep.shape[2:] != x.shape[2:]:
            raise ValueError(
                f"{name} must be [batch, S_r, heads, head_dim] = [{x.shape[0]}, S_r, {x.shape[2]}, "
                f"{x.shape[3]}] like {name[-1]}, got {tuple(rep.shape)}"
            )
    if not (replicated_q.shape[1] == replicated_k.shape[1] == replicated_v.shape[1]):
        raise ValueError(
            "replicated_q, replicated_k and replicated_v must have the same sequence length (dim 1), got "
            f"{replicated_q.shape[1]}, {replicated_k.shape[1]}, {replicated_v.shape[1]}"
        )


def check_kv_heads_split(num_kv_heads: int, degree: int, degree_name: str) -> None:
    """Ulysses gives each rank ``1 / degree`` of the KV heads too (GQA; after upstream's q-heads check)."""
    if num_kv_heads % degree:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must be divisible by the {degree_name} ({degree}); repeat the KV "
            f"heads (repeat_interleave on dim 2) up to a multiple of {degree} first"
        )


def check_no_attn_mask(attn_mask: object) -> None:
    """Padding masks (sglang's masked USP path) are not implemented."""
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask is not supported by this USPAttention (no padding-mask path); pass attn_mask=None "
            "and shard sequences of equal length"
        )


def check_replicated_modes(
    num_replicated_prefix: int, num_replicated_suffix: int, num_replicated_kv_prefix: int
) -> int:
    """Counts are ints >= 0, at most one is set (sglang's text). Returns how many are set."""
    check_count("num_replicated_prefix", num_replicated_prefix)
    check_count("num_replicated_suffix", num_replicated_suffix)
    check_count("num_replicated_kv_prefix", num_replicated_kv_prefix)
    active = sum(int(n > 0) for n in (num_replicated_prefix, num_replicated_suffix, num_replicated_kv_prefix))
    if active > 1:
        raise ValueError("USPAttention supports at most one replicated-token mode per call.")
    return active


def check_replicated_fits(name: str, count: int, seq_len: int) -> None:
    """A replicated prefix/suffix of ``count`` rows leaves at least one sharded row in q."""
    if count >= seq_len:
        raise ValueError(
            f"{name} ({count}) must be smaller than q's local sequence length ({seq_len}): the replicated "
            "tokens are part of q, and every rank needs at least one sharded token"
        )


def check_zigzag_rows(rows: int, what: str) -> None:
    """Zigzag holds two equal chunks per ring rank, so its block has an even number of rows."""
    if rows % 2:
        raise ValueError(f"the zigzag layout needs an even number of rows per ring block ({what}), got {rows}")


# ---------------------------------------------------------------------------------------------------
# Sharding a full sequence
# ---------------------------------------------------------------------------------------------------


def check_shard_args(seq_len: int, sp_rank: int, ulysses_degree: int, ring_degree: int, zigzag: bool) -> None:
    """The rank exists and the sequence splits into equal shards (two chunks per ring rank for zigzag)."""
    check_positive_int("ulysses_degree", ulysses_degree)
    check_positive_int("ring_degree", ring_degree)
    world = ulysses_degree * ring_degree
    if isinstance(sp_rank, bool) or not isinstance(sp_rank, int) or not 0 <= sp_rank < world:
        raise ValueError(f"sp_rank must be an int in [0, {world}), got {sp_rank!r}")
    parts = 2 * world if zigzag else world
    if seq_len % parts:
        if zigzag:
            layout = f"2 x ring_degree x ulysses_degree ({parts}) for the zigzag layout"
        else:
            layout = f"the world size ({parts})"
        raise ValueError(f"sequence length ({seq_len}) must be divisible by {layout}")


# ---------------------------------------------------------------------------------------------------
# Launching ranks
# ---------------------------------------------------------------------------------------------------


def check_launch_args(world_size: object, backend: Optional[str], timeout_s: object) -> None:
    """``world_size`` ranks of ``backend``: "gloo", "nccl" (one CUDA device per rank) or None (the default)."""
    check_positive_int("world_size", world_size)
    if backend is not None and backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend 'nccl' needs one CUDA device per rank: world_size={world_size}, "
            f"CUDA devices={torch.cuda.device_count()}"
        )
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    if timeout_s > MAX_TIMEOUT_S:
        raise ValueError(
            f"timeout_s must be at most {MAX_TIMEOUT_S} seconds (the launcher needs a finite limit), got {timeout_s!r}"
        )


# ---------------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------------


def check_backward_available(backend_name: str, attention_backward: object) -> None:
    """A gradient needs the backend's ``attention_backward`` (never another backend's numerics in its place).

    Raised on every rank at the same point of the backward (the first local attention backward), so
    no rank is left waiting in a collective.
    """
    if attention_backward is None:
        raise NotImplementedError(
            f"the {backend_name!r} attention backend has no backward (attention_backward=None), so no gradient "
            "can flow through its sequence-parallel attention; train with attn_ref.sequence_parallel (the "
            "PyTorch reference backward), or build the AttentionBackend with an attention_backward"
        )
