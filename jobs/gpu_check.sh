#!/usr/bin/env bash
# The GPU check: raysoft's `gpu` tests and the GPU benchmark on a machine with CUDA, in one
# prepared run that fits in ten minutes, every result written to $OUT as soon as it is known.
#
#   OUT=/some/folder bash jobs/gpu_check.sh                     # on the GPU machine
#   OUT=/tmp/gpu-check GPU_CHECK_FAKE=1 bash jobs/gpu_check.sh  # rehearsal on a CPU machine
#
# Run from the checkout's root. Python is $PYTHON (default python3; `make test-gpu` uses the
# project's .venv); raysoft and its dependencies must import there. Where the machine lacks some
# (no network), an offline bundle in .device/ with install.sh and env.sh is installed first.
# The rehearsal tells Ray of one GPU (RAY_OVERRIDE_RESOURCES) that torch does not find: every
# step runs, the hosts train on the CPU, so the script is tried before it spends GPU time.
#
# $OUT/summary.txt (read first): the machine, each step's result line; gpu_report.jsonl: each
# algorithm's largest GPU/CPU difference and each packing (tests/gpu/test_gpu.py);
# gpu_tests.txt, bench.txt: the steps' whole output; nvidia_smi.txt: utilisation and memory
# sampled every second. GPU_CHECK_BUDGET_S (default 540) caps the whole check.
set -u
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:?set OUT to the folder for the results}
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-540}
START=$(date +%s)
mkdir -p "$OUT"
SUM=$OUT/summary.txt
: > "$SUM"
say() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$SUM"; }
left() { echo $(( BUDGET - ($(date +%s) - START) - 5 )); }

# step NAME MAX_S CMD...: CMD under timeout (MAX_S or what the budget leaves), output in $OUT/NAME.txt
step() {
  local name=$1 max=$2; shift 2
  local t; t=$(left); [ "$max" -lt "$t" ] && t=$max
  if [ "$t" -lt 15 ]; then say "$name: SKIPPED (the budget is spent)"; return 0; fi
  timeout -k 10 "$t" "$@" < /dev/null > "$OUT/$name.txt" 2>&1
  local rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then say "$name: TIMED OUT after ${t}s"; else say "$name: rc=$rc"; fi
  return 0
}

if [ -f .device/install.sh ]; then
  step install 120 bash .device/install.sh
  # shellcheck disable=SC1091
  source .device/env.sh
fi
if [ "${GPU_CHECK_FAKE:-0}" = 1 ]; then
  export RAYSOFT_FAKE_GPU=1 RAY_OVERRIDE_RESOURCES='{"GPU": 1}'
  say "rehearsal: Ray is told of one GPU that torch will not find"
fi
say "machine: $(uname -n), $(nproc) CPUs; $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -1)"
command -v nvidia-smi > /dev/null && nvidia-smi -L >> "$SUM" 2>&1

SAMPLER=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
    > "$OUT/nvidia_smi.txt" 2>&1 &
  SAMPLER=$!
fi
trap '[ -n "$SAMPLER" ] && kill "$SAMPLER" 2> /dev/null' EXIT

# 1. the gpu tests: every algorithm and example on CUDA beside the CPU, packings, resume
export RAYSOFT_GPU_REPORT=$OUT/gpu_report.jsonl
: > "$RAYSOFT_GPU_REPORT"
step gpu_tests 420 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu
say "gpu tests: $(grep -E '(passed|failed|error)' "$OUT/gpu_tests.txt" | tail -1)"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -20 >> "$SUM"
"$PY" - "$RAYSOFT_GPU_REPORT" >> "$SUM" 2>&1 <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
for r in rows:
    if "max_rel_diff" in r:
        print(f"  {r['test']:10s} {r['case']:14s} max relative GPU/CPU difference {r['max_rel_diff']:.2e}"
              f" over {r['metrics']} metrics{' (identical)' if r['identical'] else ''}")
    else:
        print(f"  {r['test']:10s} {r['case']:14s} {r['share']} GPU x {r['clients_per_actor']} clients: identical")
EOF

# 2. the benchmark on the GPU (W2 first: its target is a round in 0.10 s)
step bench 300 "$PY" -m raysoft bench --device cuda
tail -n 30 "$OUT/bench.txt" >> "$SUM"
say "done"
