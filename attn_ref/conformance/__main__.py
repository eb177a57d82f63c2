"""``python -m attn_ref.conformance TARGET [options]``: run the suite, print the report, exit 0 only
when no feature failed (1 when one did, 2 for a bad command line or a target that cannot be loaded).
The prefill section tests the FA3 prefill functions the target's module exports beside it.

On a CPU device, ``TRITON_INTERPRET=1`` is set (unless set already) before the target is imported,
so a Triton target runs in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys

DTYPES = {
    "fp16": "float16",
    "float16": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp32": "float32",
    "float32": "float32",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attn_ref.conformance",
        description="Check a flash_attn_with_kvcache implementation (and the FA3 prefill "
        "functions its module exports: flash_attn_func, flash_attn_varlen_func, "
        "flash_attn_qkvpacked_func, flash_attn_combine) against the attn_ref float64 oracle and "
        "the API contract, feature by feature.",
    )
    p.add_argument(
        "target", nargs="?", help="module:function, e.g. kernels:flash_attn_with_kvcache"
    )
    p.add_argument(
        "--device", default="cpu", help="device of the tensors passed to the target (default cpu)"
    )
    p.add_argument(
        "--dtype", default="bf16", choices=sorted(DTYPES), help="input dtype of the value probes"
    )
    p.add_argument(
        "--select",
        default="quick",
        help="quick, default or full; or comma-separated feature / family names (and a size)",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed of the random probes")
    p.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    p.add_argument(
        "--unsupported", default="", help="comma-separated capabilities the target does not support"
    )
    p.add_argument(
        "--no-repro", action="store_true", help="print failures without their repro snippets"
    )
    p.add_argument(
        "--list", action="store_true", help="list the features and capabilities, then exit"
    )
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from . import CAPABILITIES, FEATURES, run_conformance

    if args.list:
        print("features:")
        for feature in FEATURES:
            print(
                f"  {feature.name:<34} {feature.summary}"
                + (f"  [needs {', '.join(feature.needs)}]" if feature.needs else "")
            )
        print("capabilities (--unsupported):")
        for name, what in CAPABILITIES.items():
            print(f"  {name:<16} {what}")
        return 0
    if not args.target:
        parser().error("TARGET is required (module:function)")
    unsupported = [name for name in args.unsupported.split(",") if name.strip()]
    try:
        report = run_conformance(
            args.target,
            device=args.device,
            dtype=getattr(torch, DTYPES[args.dtype]),
            select=args.select,
            seed=args.seed,
            unsupported=[n.strip() for n in unsupported],
            progress=lambda r: print(
                f"{r.status.upper():<13} {r.name}  ({r.seconds:.2f}s)", file=sys.stderr
            ),
        )
    # a target that cannot be loaded, an unknown name in --select / --unsupported
    except ValueError as exc:
        parser().error(str(exc))
    if args.report:
        report.write(args.report)
    print(report.text(repros=not args.no_repro))
    return report.exit_status


if __name__ == "__main__":
    sys.exit(main())
