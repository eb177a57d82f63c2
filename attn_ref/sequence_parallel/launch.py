"""Run a function on N local ranks with ``torch.distributed`` initialised, and collect the results.

:func:`launch` is for tests, notebooks and experiments on one machine: it spawns ``world_size``
processes, initialises a process group in each (gloo on CPU; NCCL, one GPU per rank, when there are
enough CUDA devices), runs ``fn(*args)`` and returns the per-rank results. A rank that raises makes
``launch`` raise that exception (the first one reported; every failing rank's traceback is attached
as a note); a rank ended by ``SystemExit`` (``sys.exit``) or ``KeyboardInterrupt`` raises
``ChildProcessError`` instead, never the caller's own exit; a run that exceeds ``timeout_s`` is
killed and raises ``TimeoutError``, so a hang never blocks the caller.

``fn`` must be importable by the children (a module-level function, not a lambda or a notebook
cell's closure), and its result must be picklable (tensors are fine).

**Across machines** use ``torchrun``, which starts one process per GPU and sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. On every node::

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=node0:29500
    my_script.py

and in ``my_script.py``::

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))   # before any NCCL call (else P2P can
    hang)
    torch.distributed.init_process_group("nccl")            # reads the variables above
    groups = init_sequence_parallel_groups(ulysses_degree=8, ring_degree=2)  # Ulysses inside a node
    attn = USPAttention(num_heads, head_size, causal=True, groups=groups, zigzag=True)

Contiguous Ulysses groups put the all-to-all on a node's NVLink, and the ring crosses nodes.
"""

from __future__ import annotations

import io
import os
import pickle
import queue
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..error_notes import catalogued
from .checks import check_positive_int

#: After the first rank fails, how long to wait for the other ranks' reports before killing them.
FAILURE_GRACE_S = 5.0
#: How long a rank's report may take to arrive after it exits, and a finished rank to exit.
EXIT_FLUSH_S = 2.0

#: The longest run :func:`~attn_ref.sequence_parallel.launch` accepts (about 116 days; ``inf`` is
#: refused).
MAX_TIMEOUT_S = 10_000_000


def default_backend(world_size: int) -> str:
    """ "nccl" when every rank can have its own CUDA device, else "gloo"."""
    return (
        "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    )


@catalogued
def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    backend: Optional[str] = None,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` local ranks; returns ``[result of rank 0, ...]``.

    Args:
        fn: module-level function; inside it ``torch.distributed`` is initialised
            (``dist.get_rank()``, ``dist.get_world_size()``; NCCL ranks have their device set).
        world_size: number of processes.
        args: picklable arguments, the same for every rank.
        backend: "gloo" or "nccl" (default :func:`default_backend`).
        timeout_s: limit for the whole run, and the process group's collective timeout: a number of
            seconds in ``(0, 10_000_000]`` (``inf``, NaN, bools and non-numbers are refused).
    """
    check_launch_args(world_size, backend, timeout_s)
    backend = default_backend(world_size) if backend is None else backend
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        init_method = "file://" + os.path.join(store_dir, "store")
        procs = [
            ctx.Process(
                target=_run_rank,
                args=(fn, tuple(args), rank, world_size, backend, init_method, timeout_s, reports),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            outcomes = _collect(reports, procs, timeout_s)
        finally:
            _stop(procs)
    # in order of arrival
    failures = {rank: payload for rank, (ok, payload) in outcomes.items() if not ok}
    if failures:
        # The first failure is the cause; later ones are usually its echo (a peer closed the
        # connection).
        first_rank, (pickled, _) = next(iter(failures.items()))
        error = _as_rank_failure(pickle.loads(pickled), first_rank, world_size)
        for rank, (_, trace) in failures.items():
            error.add_note(f"--- rank {rank} of {world_size} ---\n{trace}")
        raise error
    return [
        torch.load(io.BytesIO(outcomes[rank][1]), weights_only=False) for rank in range(world_size)
    ]


def _run_rank(fn, args, rank, world_size, backend, init_method, timeout_s, reports) -> None:
    """Child process: init the group, run ``fn``, report ``(rank, ok, payload)``."""
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:  # CPU ranks share the machine's cores instead of each spawning one thread per core
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:  # a failed init (e.g. a peer died while connecting) is reported like any failure
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(*args)
        buffer = io.BytesIO()
        torch.save(result, buffer)  # bytes: valid after this process exits
        reports.put((rank, True, buffer.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        reports.put((rank, False, (_pickled(exc), traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _as_rank_failure(exc: BaseException, rank: int, world_size: int) -> Exception:
    """A rank's exception, to raise in the caller. ``SystemExit``, ``KeyboardInterrupt`` and other
    non-``Exception`` s ended that rank, not the caller: they become a ``ChildProcessError``."""
    if isinstance(exc, Exception):
        return exc
    error = ChildProcessError(f"rank {rank} of {world_size} ended with {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _pickled(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an unpicklable exception still reports its text
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))


def _collect(reports, procs, timeout_s: float) -> dict[int, tuple[bool, Any]]:
    """Per-rank ``(ok, payload)``; stops early a grace period after the first failure."""
    outcomes: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(outcomes) < len(procs):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if any(not ok for ok, _ in outcomes.values()):
                return outcomes  # the other ranks are stuck waiting for the failed one
            missing = sorted(set(range(len(procs))) - set(outcomes))
            raise TimeoutError(
                f"ranks {missing} of {len(procs)} did not finish within timeout_s={timeout_s} s"
            )
        try:
            rank, ok, payload = reports.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            if _exited_silently(procs, outcomes):
                time.sleep(EXIT_FLUSH_S)  # its report may still be in the pipe
                if reports.empty():
                    rank = _exited_silently(procs, outcomes)[0]
                    raise ChildProcessError(
                        f"rank {rank} exited with code {procs[rank].exitcode} without reporting a "
                        "result"
                    ) from None
            continue
        outcomes[rank] = (ok, payload)
        if not ok:
            deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
    return outcomes


def _exited_silently(procs, outcomes) -> list[int]:
    """Ranks whose process has exited without a report read so far (a crash or a kill)."""
    return [rank for rank, p in enumerate(procs) if rank not in outcomes and p.exitcode is not None]


def _stop(procs) -> None:
    """Join the children; kill those still running (stuck in a collective after a failure)."""
    deadline = time.monotonic() + EXIT_FLUSH_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_launch_args(world_size: object, backend: Optional[str], timeout_s: object) -> None:
    """``world_size`` ranks of ``backend``: "gloo", "nccl" (one CUDA device per rank) or None (the
    default)."""
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
            f"timeout_s must be at most {MAX_TIMEOUT_S} seconds (the launcher needs a finite "
            f"limit), got {timeout_s!r}"
        )
