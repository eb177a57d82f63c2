"""Entry point: ``python -m benchmarks.run [--quick] [--device cpu|cuda] [--out DIR] [--threads
N]``.

Measures one device's suites, prints the table and writes, under ``DIR`` (default
``benchmarks/results/``): ``<device>.json``, ``<device>.md`` and ``<device>_<suite>.png``.

* ``--device cpu`` (default without CUDA): :mod:`benchmarks.cpu`. Full mode takes about 9 minutes on
  a quiet 2-core machine with ``--threads 1`` (4 of them the training steps); ``--quick`` uses
  small shapes and runs in seconds (the test suite's check of the harness). On a machine shared
  with other jobs, ``--threads 1`` keeps OpenMP threads from waiting on descheduled peers, which
  otherwise inflates the many small ops of the reference far more than SDPA's few large ones; the
  per-case load average is recorded either way.
* ``--device cuda``: :mod:`benchmarks.gpu`. Refuses to run under the Triton interpreter.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import torch

from . import plots, record

DEFAULT_OUT = Path(__file__).with_name("results")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("--quick", action="store_true", help="small shapes, few repetitions")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: torch's choice); on a "
        "machine shared with other jobs, 1 avoids OpenMP threads waiting on descheduled peers",
    )
    return parser.parse_args(argv)


class TimeLimit(BaseException):
    """Raised by SIGTERM (``timeout`` in benchmarks/gpu_check.sh): the cases done so far are kept.

    A ``BaseException``, so the suites' ``except Exception`` (a provider that fails) cannot swallow
    it."""


def _raise_time_limit(signum, frame):
    raise TimeLimit(f"stopped by signal {signum} (time limit)")


def measure(device: str, quick: bool) -> dict:
    """Run one device's suites; returns the result document (see :mod:`benchmarks.record`)."""
    if device == "cuda":
        from . import gpu as suite

        result = record.metadata("cuda", {"quick": quick, "timing": suite.TIMING})
        result["ceilings"] = suite.ceilings()
        cases = suite.run(quick, result["ceilings"])
    else:
        from . import cpu as suite

        result = record.metadata(
            "cpu", {"quick": quick, "timing": suite.TIMING, "memory": suite.MEMORY}
        )
        cases = suite.run(quick)
    result["cases"] = []
    start = time.perf_counter()
    try:
        for case in cases:
            result["cases"].append(case)
            print(
                f"[{time.perf_counter() - start:6.1f} s] {case['suite']} {case['label']}",
                flush=True,
            )
    except TimeLimit as stop:
        result["settings"]["stopped_early"] = str(stop)
    result["targets"] = suite.targets(result["cases"])
    record.finish(result)
    return result


def write(result: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    device = result["device"]
    json_path, md_path = out_dir / f"{device}.json", out_dir / f"{device}.md"
    record.write_json(result, json_path)
    md_path.write_text(record.markdown(result))
    return [json_path, md_path, *plots.plot_all(result, out_dir)]


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device (interpreter timings are not benchmarks)")
    if args.threads:
        torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, _raise_time_limit)
    result = measure(args.device, args.quick)
    print(record.text_table(result))
    print(record.provenance(result))
    for path in write(result, args.out):
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
