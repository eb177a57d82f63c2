#!/usr/bin/env bash
# GPU check: the kernel tests on the GPU, then the GPU benchmarks, on a CUDA machine without internet.
#
#   bash benchmarks/gpu_check.sh OUTDIR
#
# Uses the machine's own python3 (or $PYTHON) and packages as they are: nothing is installed, the
# repository is put on PYTHONPATH. Where the tree arrives without .git, set ATTN_REF_GIT to the
# commit (`git describe --always --dirty` where it was copied from) so the results name it.
# Every step runs under `timeout` (SIGTERM, then SIGKILL 10 s later), so one hang cannot eat the
# budget; the limits add up to 570 s. A benchmark stopped by its limit still writes the cases it
# finished. The tests include tests/test_kernels_cuda_graph.py (a decode step of the public call
# captured in a CUDA graph, replayed with new tokens and cache_seqlens, equal to eager calls); the
# benchmarks' graph suite times eager calls against graph replays. OUTDIR receives eleven flat files:
#   gpu_check.log   versions, nvidia-smi (summary, -q clocks/power/temperature, clocks after the
#                   benchmarks), the test log and the benchmark log
#   cuda.json       results (benchmarks/schema.json), cuda.md the same as a Markdown table
#   cuda_decode.png, cuda_prefill.png, cuda_combine.png, cuda_graph.png
#   backward.json   the backward suite (kernels.attention_backward vs SDPA's backward), backward.md
#   training.json   the training suite (kernels.flash_attn_func forward + backward vs SDPA flash's),
#                   training.md
set -uo pipefail  # no -e: a failing step is logged and the next one still runs

out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
log="$out/gpu_check.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset TRITON_INTERPRET  # compiled kernels, never the interpreter
summary=()

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  echo "===== $name (limit ${limit} s): $*" >>"$log"
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  echo "===== $name: exit $rc after $((SECONDS - start)) s" >>"$log"
  summary+=("$name: exit $rc after $((SECONDS - start)) s$([ $rc -eq 124 ] && echo ' (TIMED OUT)')")
}

date -u +"gpu_check started %Y-%m-%dT%H:%M:%SZ in $PWD" >"$log"
step versions 20 "$py" -c "
import platform, torch, triton
print('python', platform.python_version(), '| torch', torch.__version__, '| cuda', torch.version.cuda,
      '| triton', triton.__version__)
from benchmarks.record import versions
print('attn_ref', versions()['attn_ref_git'])
p = torch.cuda.get_device_properties(0)
print(p.name, '| SMs', p.multi_processor_count, '| memory GB', p.total_memory / 1e9, '| cc', p.major, p.minor)"
step nvidia-smi 20 bash -c "nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE"
# The kernels' tests (and the feature tests parametrised over both implementations), the kernel
# backward, then the kernel-backed sequence-parallel tests (the kernels' spawns of the modules that
# are parametrised over both implementations: their test ids contain "kernels").
step tests 160 "$py" -m pytest tests/test_kernels_*.py tests/test_kvcache_*.py tests/test_backward_kernels.py \
  -x -q -p no:cacheprovider
step sp-tests 90 "$py" -m pytest tests/test_sequence_parallel_ranks.py tests/test_sp_backward.py -k kernels \
  -x -q -p no:cacheprovider
step bench 150 "$py" -m benchmarks.run --device cuda --out "$out"
step bench-backward 60 "$py" -m benchmarks.gpu_backward --out "$out"
step bench-training 60 "$py" -m benchmarks.gpu_training --out "$out"
step clocks-after 10 nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv

printf '%s\n' "${summary[@]}" | tee -a "$log"
ls "$out"
