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
# $OUT/summary.txt (read first): the machine, each step's result line, the bench's tables;
# gpu_report.jsonl: each algorithm's largest GPU/CPU difference and each packing
# (tests/gpu/test_algorithms_on_gpu.py); log.txt: every step's whole output; nvidia_smi.txt: utilisation and
# memory every second; bench/: jobs/gpu_bench.sh's summary, log and runs. GPU_CHECK_BUDGET_S
# (default 540) caps the whole check; GPU_BENCH_DEVICE and GPU_BENCH_QUICK are passed on.
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

# step NAME MAX_S CMD...: CMD under timeout (MAX_S or what the budget leaves), its output in
# $WORK/NAME.txt and $OUT/log.txt
WORK=${GPU_CHECK_WORK:-/tmp/raysoft-gpu-check}
rm -rf "$WORK"; mkdir -p "$WORK"
: > "$OUT/log.txt"
step() {
  local name=$1 max=$2; shift 2
  local t; t=$(left); [ "$max" -lt "$t" ] && t=$max
  if [ "$t" -lt 15 ]; then say "$name: SKIPPED (the budget is spent)"; return 0; fi
  echo "===== $name (timeout ${t}s): $*" >> "$OUT/log.txt"
  timeout -k 10 "$t" "$@" < /dev/null 2>&1 | tee "$WORK/$name.txt" >> "$OUT/log.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then say "$name: TIMED OUT after ${t}s"; else say "$name: rc=$rc"; fi
  return 0
}

if [ -f .device/install.sh ]; then
  step install 120 bash .device/install.sh
  # shellcheck disable=SC1091
  source .device/env.sh
fi
if [ "${GPU_CHECK_FAKE:-0}" = 1 ]; then
  export RAYSOFT_FAKE_GPU=1 RAY_OVERRIDE_RESOURCES='{"GPU": 1}' GPU_BENCH_DEVICE=${GPU_BENCH_DEVICE:-cpu}
  export GPU_BENCH_QUICK=${GPU_BENCH_QUICK:-1}
  say "rehearsal: Ray is told of one GPU that torch will not find; the bench runs on the CPU, quick"
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

# 1. the gpu tests: every algorithm and example on CUDA beside the CPU, packings, resume, states
#    off the GPU (tests/gpu); the bench's own (tests/bench)
export RAYSOFT_GPU_REPORT=$OUT/gpu_report.jsonl
: > "$RAYSOFT_GPU_REPORT"
step gpu_tests "${GPU_CHECK_TESTS_S:-270}" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu tests/bench
say "gpu tests: $(grep -E '(passed|failed|error)' "$WORK/gpu_tests.txt" | tail -1)"
grep -E "^(FAILED|ERROR)" "$WORK/gpu_tests.txt" | head -20 >> "$SUM"
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

# 2. the benchmark on the GPU with what the budget leaves: W2 (its target: a round in 0.10 s) on
#    a whole GPU, W5, W2 on 0.125 shares, then W1 and W4 (jobs/gpu_bench.sh; its summary in
#    $OUT/bench/summary.txt, copied below)
if [ "$(left)" -ge 60 ]; then
  GPU_BENCH_TESTS=0 GPU_BENCH_BUDGET_S=$(left) OUT=$OUT/bench bash jobs/gpu_bench.sh >> "$OUT/log.txt" 2>&1
  say "bench: rc=$?"
  sed 's/^/  /' "$OUT/bench/summary.txt" >> "$SUM" 2> /dev/null
else
  say "bench: SKIPPED (the budget is spent)"
fi
say "done"
