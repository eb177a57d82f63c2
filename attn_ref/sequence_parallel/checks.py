"""Argument checks shared by several modules of the sequence-parallel package.

A check with a single caller lives in its module, at the end under "Argument checks of this module"
(``check_ring_window`` in :mod:`.ring_flash_attn`, ``check_launch_args`` in :mod:`.launch`, ...);
this module holds the ones several modules call. Every check, here or there, follows two rules that
make a bad call fail fast instead of hanging a job:

* **Before any collective.** Each entry point runs all its checks first; a rank that raises has not
  entered an all-to-all, all-gather or ring exchange the other ranks would wait in.
* **The same on every rank.** A check reads only what every rank of a well-formed call agrees on:
  shapes, dtypes, head counts, the group degrees, ``seq_lens``. When the ranks of the group are
  given the same kind of call, they all raise the same error. (One rank passing a tensor of a
  different shape than the others cannot be detected without a collective; that call still hangs or
  fails inside torch.distributed.)

Messages follow upstream (sglang's ``layer.py``, ``usp.py`` and ``AllToAll4D``) verbatim where
upstream has one; upstream ``assert`` s and ``RuntimeError`` s on arguments become ``ValueError`` s
here. Checks this package adds run after the upstream ones of the same call.
"""

from __future__ import annotations

from typing import Sequence

import torch


def check_positive_int(name: str, value: object) -> None:
    """``value`` is an int (not a bool) >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_seq_lens(seq_lens: Sequence[int], world_size: int) -> list[int]:
    """``seq_lens``: one local sequence length per rank of the group (its values:
    :func:`check_seq_lens_values`)."""
    if isinstance(seq_lens, torch.Tensor) or not isinstance(seq_lens, (list, tuple)):
        raise TypeError(f"seq_lens must be a list of ints, got {type(seq_lens).__name__}")
    if len(seq_lens) != world_size:
        raise ValueError(f"seq_lens must have length {world_size}, got {len(seq_lens)}")
    return list(seq_lens)


def check_seq_lens_values(seq_lens: list) -> None:
    """Every local length is an int >= 0 (this package's check, after upstream's ``usp.py``
    asserts)."""
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in seq_lens):
        raise ValueError(f"seq_lens must hold non-negative ints, got {list(seq_lens)}")


def check_local_seq_len(q: torch.Tensor, seq_lens: list[int], rank: int) -> None:
    """Varlen: this rank's local length is its entry of ``seq_lens`` (usp.py's text)."""
    if q.shape[1] != seq_lens[rank]:
        raise ValueError(f"s_local ({q.shape[1]}) must equal seq_lens[{rank}] ({seq_lens[rank]})")


def check_heads_split(hn: int, world_size: int) -> None:
    """``AllToAll4D``'s assert: the heads split evenly over the group (UlyssesAttention's q
    heads)."""
    if hn % world_size:
        raise ValueError(
            f"head dimension ({hn}) must be divisible by sequence parallel world size "
            f"({world_size})"
        )


def check_usp_heads_split(h_global: int, world_size: int) -> None:
    """``usp.py``'s ``_usp_input_all_to_all`` assert: the heads split evenly over the Ulysses
    group."""
    if h_global % world_size:
        raise ValueError(f"h_global ({h_global}) must be divisible by world_size ({world_size})")


def check_tensors(**tensors: object) -> None:
    """Each named argument is a tensor."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_4d(**tensors: torch.Tensor) -> None:
    """Upstream's ``assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "Expected 4D
    tensors"``."""
    if any(x.dim() != 4 for x in tensors.values()):
        raise ValueError("Expected 4D tensors")


def check_attention_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_extra_rows: int = 0
) -> None:
    """q ``[b, S / P, h, d]``, k ``[b, S / P + kv_extra_rows, h_k, d]``, v ``[b, same, h_k, d_v]``,
    one dtype/device.

    ``kv_extra_rows`` is the length of a K/V-only replicated prefix (0 otherwise).
    """
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k and v must be float16, bfloat16 or float32, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}"
        )
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"q, k and v must have the same batch size (dim 0), got {q.shape[0]}, {k.shape[0]}, "
            f"{v.shape[0]}"
        )
    if k.shape[1] != v.shape[1] or k.shape[1] != q.shape[1] + kv_extra_rows:
        extra = f" + {kv_extra_rows} K/V-only prefix rows" if kv_extra_rows else ""
        raise ValueError(
            f"k and v must have q's sequence length{extra} (dim 1): q {q.shape[1]}, k "
            f"{k.shape[1]}, v {v.shape[1]}"
        )
    if k.shape[2] != v.shape[2] or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"k and v must have the same number of heads, dividing q's (dim 2): q {q.shape[2]}, "
            f"k {k.shape[2]}, v {v.shape[2]}"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q and k must have the same head_dim (dim 3), got {q.shape[3]} and {k.shape[3]}"
        )


def check_no_dropout(name: str, value: object) -> None:
    """Attention dropout is not implemented (the reference is deterministic): only 0 is accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != 0:
        raise NotImplementedError(
            f"{name}={value!r} is not supported: attention dropout is not implemented; pass "
            f"{name}=0.0 "
            "(inference), or apply dropout outside the attention call"
        )


def check_kv_heads_split(num_kv_heads: int, degree: int, degree_name: str) -> None:
    """Ulysses gives each rank ``1 / degree`` of the KV heads too (GQA; after upstream's q-heads
    check)."""
    if num_kv_heads % degree:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must be divisible by the {degree_name} ({degree}); "
            "repeat the KV "
            f"heads (repeat_interleave on dim 2) up to a multiple of {degree} first"
        )


def check_zigzag_rows(rows: int, what: str) -> None:
    """Zigzag holds two equal chunks per ring rank, so its block has an even number of rows."""
    if rows % 2:
        raise ValueError(
            f"the zigzag layout needs an even number of rows per ring block ({what}), got {rows}"
        )
