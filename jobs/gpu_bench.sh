#!/usr/bin/env bash
# `raysoft bench --device cuda` on the GPU machine (issue #44, item 3): a prepared script for one
# GPU session, the bench half of jobs/gpu_check.sh. From the root of a checkout (with an offline
# bundle in .device/ where the machine lacks raysoft's dependencies):
#
#   bash jobs/gpu_bench.sh                      remotely: OUT is set, carry [".device"]
#   OUT=/tmp/gb GPU_BENCH_DEVICE=cpu GPU_BENCH_QUICK=1 PYTHON=.venv/bin/python bash jobs/gpu_bench.sh
#                                               the rehearsal on a CPU machine (same steps, --device cpu)
#
# Most important first, each step under `timeout` within a global budget (GPU_BENCH_BUDGET_S,
# 480 s), each result appended to $OUT/summary.txt as soon as it is known:
#   0. the bundle's install (.device/install.sh, offline) and env.sh, where there is a bundle
#   1. nvidia-smi -L and torch's view of CUDA
#   2. the bench's GPU tests: pytest -m gpu tests/bench (they skip without CUDA)
#   3. W2 on the GPU: raysoft on one actor with the whole GPU (its 60 clients a round in one
#      vectorised step: train.gpu_rows 64), the bare loop, the floor (Flower: --flower)
#   4. W5 (FedAvg, N = 10,000) on the GPU, on one actor
#   5. W2 with raysoft on 0.125-GPU actors (GPU_BENCH_SHARE: 8 actors, gpu_rows 8)
#   6. W1 and W4 (FedSoft and FedAvg at N = 1,000) if the budget leaves 150 s
# Every bench passes --timeout (what the budget leaves) so that it stops its own measurement;
# bench.md and bench.parquet are written after every row, so a stopped bench keeps its rows.
# Back in $OUT: summary.txt (read first: every bench.md is in it), log.txt, benches.tgz.
set -u
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 RAY_USAGE_STATS_ENABLED=0

OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
ROOT=$(pwd)
PY=${PYTHON:-python3}
DEVICE=${GPU_BENCH_DEVICE:-cuda}
SHARE=${GPU_BENCH_SHARE:-0.125}
FLOWER=${GPU_BENCH_FLOWER:-skip}
QUICK=()
[ "${GPU_BENCH_QUICK:-0}" = 1 ] && QUICK=(--quick --rounds 2)
BUDGET=${GPU_BENCH_BUDGET_S:-480}
WORK=${GPU_BENCH_WORK:-/tmp/raysoft-gpu-bench}
SUM=$OUT/summary.txt
LOG=$OUT/log.txt
START=$(date +%s)
: > "$SUM"
: > "$LOG"
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) - 10 )); }
say() { local l="[$(elapsed)s] $*"; echo "$l" | tee -a "$SUM" >> "$LOG"; echo "$l"; }

# step NAME MAX CMD...: CMD under timeout (MAX or what the budget leaves), its output in the log
# and in $WORK/NAME.txt; RC is its exit code (124/137: timed out; 99: skipped for the budget)
step() {
  local name=$1 max=$2; shift 2
  local t
  t=$(left)
  [ "$max" -lt "$t" ] && t=$max
  : > "$WORK/$name.txt"
  if [ "$t" -lt 30 ]; then say "$name: SKIPPED ($(left) s of the budget left)"; RC=99; return 0; fi
  echo "===== $name (timeout ${t}s): $*" >> "$LOG"
  timeout -k 15 "$t" "$@" < /dev/null 2>&1 | tee "$WORK/$name.txt" >> "$LOG"
  RC=${PIPESTATUS[0]}
  echo "===== $name: rc=$RC at $(elapsed)s" >> "$LOG"
  return 0
}

# bench NAME WORKLOADS MAX [SHARE]: raysoft bench on WORKLOADS (raysoft's actors on SHARE of the
# GPU each, default $SHARE) into $WORK/NAME, its table into the summary
bench() {
  local name=$1 workloads=$2 max=$3 share=${4:-$SHARE} t
  t=$(left)
  [ "$max" -lt "$t" ] && t=$max
  step "$name" "$max" "$PY" -m raysoft bench --device "$DEVICE" --gpu-share "$share" --workload "$workloads" \
    --flower "$FLOWER" --pfl skip --timeout $(( t > 60 ? t - 30 : 30 )) --out "$WORK/$name" "${QUICK[@]}"
  say "$name ($workloads, --device $DEVICE, share $share): rc=$RC"
  grep -h "s/round\|left out\|raysoft bench:" "$WORK/$name.txt" | sed 's/^/  /' >> "$SUM"
  [ -f "$WORK/$name/bench.md" ] && sed 's/^/  /' "$WORK/$name/bench.md" >> "$SUM"
  [ "$RC" != 0 ] && tail -n 5 "$WORK/$name.txt" | sed 's/^/  | /' >> "$SUM"
  return 0
}

rm -rf "$WORK"
mkdir -p "$WORK"
say "raysoft GPU bench: $(date -u +%FT%TZ) on $(uname -n), budget ${BUDGET}s, device $DEVICE, quick ${GPU_BENCH_QUICK:-0}"
git -C "$ROOT" log -1 --format='  commit %h %s' 2>/dev/null >> "$SUM"

# 0. the bundle
if [ -f "$ROOT/.device/install.sh" ]; then
  step install 120 bash "$ROOT/.device/install.sh"
  [ "$RC" != 0 ] && { say "INSTALL FAILED (rc=$RC)"; tail -n 10 "$WORK/install.txt" >> "$SUM"; exit 1; }
  # shellcheck disable=SC1091
  source "$ROOT/.device/env.sh"
  say "install: OK"
fi

# 1. the machine
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv; } \
  2>&1 | sed 's/^/  /' | tee -a "$LOG" >> "$SUM"
step torch 60 "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
sed 's/^/  /' "$WORK/torch.txt" >> "$SUM"

# 2. the bench's GPU tests (GPU_BENCH_TESTS=0: left to the caller, jobs/gpu_check.sh)
if [ "${GPU_BENCH_TESTS:-1}" = 1 ]; then
  step gpu_tests 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/bench
  say "pytest -m gpu tests/bench: rc=$RC; $(tail -n 1 "$WORK/gpu_tests.txt")"
  [ "$RC" != 0 ] && grep -E "^(FAILED|ERROR)|Error" "$WORK/gpu_tests.txt" | head -8 | sed 's/^/  | /' >> "$SUM"
fi

# 3-6. the benches
bench bench_w2 W2 200 1
bench bench_w5 W5 200 1
bench bench_w2_shared W2 150
if [ "$(left)" -ge 150 ]; then bench bench_w1_w4 W1,W4 "$(left)"; else say "W1, W4: SKIPPED ($(left) s left)"; fi

( cd "$WORK" && tar -czf "$OUT/benches.tgz" bench_* ) > /dev/null 2>&1 || true
say "done in $(elapsed)s"
