"""Benchmarks of ``attn_ref`` (CPU) and ``kernels`` (GPU) against torch SDPA on the same problems.

One entry point, run from the repository root (the package is not installed)::

    python -m benchmarks.run [--quick] [--device cpu|cuda] [--out DIR]

It prints a table and writes ``<device>.json`` (validated by ``benchmarks/schema.json``),
``<device>.md`` (the same table in Markdown, for the docs) and ``<device>_<suite>.png`` plots to
``benchmarks/results/`` (or ``--out``). Every file records the machine, date, versions and command.

* :mod:`benchmarks.calls` - the case factory (``make_case``): random valid calls, shared with the
  tests (``tests/kvcache_cases.py``), so every timed problem is a tested problem
  (``tests/test_benchmarks.py::test_timed_problems_match_the_oracle``).
* :mod:`benchmarks.problems` - the shapes, the input builders (through ``make_case``) and the byte /
  FLOP formulas.
* :mod:`benchmarks.training` - the training problems: ``flash_attn_func`` forward and backward
  against SDPA's, their inputs, steps and FLOP / byte counts.
* :mod:`benchmarks.cpu` - reference vs SDPA on the CPU (``flash_attn_with_kvcache`` calls and
  training steps): median time ratio and peak memory.
* :mod:`benchmarks.gpu` - kernels vs SDPA (and FlashAttention when installed) on a CUDA device:
  decode bandwidth, prefill FLOP/s and the combine kernel's bandwidth.
* :mod:`benchmarks.record` - run metadata, JSON and Markdown output.
* :mod:`benchmarks.plots` - the PNG figures.
* :mod:`benchmarks.gpu_backward`, :mod:`benchmarks.gpu_training` - the kernels' backward, and their
  ``flash_attn_func`` training step, against SDPA's flash backend (TFLOP/s; own JSON files).
* ``benchmarks/gpu_check.sh OUTDIR`` - GPU tests plus GPU benchmarks in one time-boxed script.

Timings of the Triton interpreter are not benchmarks: the GPU suite refuses to run without CUDA.
"""
