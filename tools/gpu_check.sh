#!/usr/bin/env bash
# The GPU measurement in one command, for a lent device (about 8 minutes on one H100 or H200).
#
#   On the device (the kit carried):  source .device-kit/unpack.sh || exit 1; bash tools/gpu_check.sh
#   On a GPU machine of your own:     make gpu-check
#
# Writes under $OUT (default ./gpu-check), each step within what is left of $BUDGET_S (default 480 s):
#   gpu.txt             the GPU (nvidia-smi -L) and the driver
#   dmon.txt            SM and memory utilisation every second through the whole check (nvidia-smi dmon)
#   rss.txt             each worker process's largest resident memory seen (MiB, sampled every 2 s): the
#                       per-process figure behind the chart's gpu.perProcess
#   test-gpu.txt        `pytest -m gpu tests/gpu`: fp16 against fp32, the worker end to end with the NVML
#                       gauges read off /metrics, four processes sharing the GPU end to end
#   processes/          `bench --processes 1,2,4,8`: R1_gpu for S1 and S2 at each K (SM %, tokens/s,
#                       TFLOP/s), and the best K of S2 again without the cache
#   quick/              `bench --device cuda --quick`: every row of the bench on the GPU (two models,
#                       S5, long documents, the instant source)
#   sampler/            where each thread of each process spends its wall time, at the best K of S2,
#                       when R1_gpu stays under 0.9 there and time is left ($SAMPLER: a sampler.py
#                       to load, default .device-kit/sampler.py)
#   summary.md          the figures above in one table, with what each step exited
set -u
OUT=${OUT:-gpu-check}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
DOCS=${DOCS:-20000}
DEVICE=${DEVICE:-cuda}      # cpu: a dry run of the script itself on a machine without a GPU
COUNTS=${COUNTS:-1,2,4,8}
SAMPLER=${SAMPLER:-.device-kit/sampler.py}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
step() {  # step NAME MAX_SECONDS COMMAND...: run within min(MAX, what is left); note its exit and time
  local name=$1 max=$2; shift 2
  local room; room=$(left); [ "$room" -lt "$max" ] && max=$room
  if [ "$max" -le 10 ]; then echo "$name: skipped (no time left)" >> "$OUT/steps.txt"; return; fi
  local t0; t0=$(date +%s)
  timeout "$max" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s (limit $max s)" >> "$OUT/steps.txt"
}

: > "$OUT/steps.txt"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$OUT/gpu.txt" 2>&1
nvidia-smi dmon -s um -d 1 > "$OUT/dmon.txt" 2>&1 &
DMON=$!
# Every 2 s, each embedstream process's resident MiB; rss.txt keeps each pid's largest, with its command.
( while sleep 2; do ps -eo pid=,rss=,args= | awk '/embedstream|worker\.commands|multiprocessing/ && !/awk/'; done ) \
  > /tmp/gpu-check-rss.txt 2>/dev/null &
RSS=$!
export EMBEDSTREAM_LOG_LEVEL=WARNING HF_HUB_OFFLINE=1

step test-gpu 150 "$PY" -m pytest -q -s -m gpu tests/gpu
step processes 240 "$PY" -m worker.commands.cli bench --device "$DEVICE" --processes "$COUNTS" --docs "$DOCS" \
  --broker mock --output "$OUT/processes" --state-dir /tmp/gpu-check-processes
step quick 180 "$PY" -m worker.commands.cli bench --device "$DEVICE" --quick --docs $(( DOCS < 4000 ? DOCS : 4000 )) --broker mock \
  --output "$OUT/quick" --state-dir /tmp/gpu-check-quick
# A step cut by its time limit leaves its local stack running (the bench stops it only on its way out):
# stopped here, so the steps after it have the cores.
for state in /tmp/gpu-check-processes /tmp/gpu-check-quick; do
  "$PY" -m worker.commands.cli dev down --state-dir "$state" > /dev/null 2>&1 || true
done

# Under the goal: the best K of S2 again, every process sampled (a sitecustomize that starts the sampler
# in each Python process and writes its counts on exit, one file a process).
BEST=$("$PY" -m tools.bench.gpu_summary "$OUT" --below-goal 2>/dev/null)
if [ -n "$BEST" ] && [ -f "$SAMPLER" ]; then
  mkdir -p "$OUT/sampler" /tmp/gpu-check-site
  cp "$SAMPLER" /tmp/gpu-check-site/sampler.py
  cat > /tmp/gpu-check-site/sitecustomize.py <<PY
import os
if os.environ.get("GPU_CHECK_SAMPLE"):
    os.environ["SAMPLER_OUT"] = os.path.join(os.environ["GPU_CHECK_SAMPLE"], f"sampler-{os.getpid()}.txt")
    import sampler
    sampler.start()
PY
  export GPU_CHECK_SAMPLE="$OUT/sampler" PYTHONPATH="/tmp/gpu-check-site:${PYTHONPATH:-}"
  step sampled 90 "$PY" -m worker.commands.cli bench --device "$DEVICE" --processes "$BEST" --docs "$DOCS" \
    --broker mock --output "$OUT/sampled" --state-dir /tmp/gpu-check-sampled
  unset GPU_CHECK_SAMPLE
fi

kill "$DMON" "$RSS" 2>/dev/null
awk '{ pid = $1; rss = $2; $1 = $2 = ""; if (rss > max[pid]) { max[pid] = rss; what[pid] = $0 } }
     END { for (p in max) printf "%d MiB  pid %s %s\n", max[p] / 1024, p, what[p] }' /tmp/gpu-check-rss.txt \
  | sort -rn > "$OUT/rss.txt" 2>/dev/null
"$PY" -m tools.bench.gpu_summary "$OUT" > "$OUT/summary.md" 2>&1
cat "$OUT/steps.txt" "$OUT/summary.md"
