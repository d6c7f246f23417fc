#!/usr/bin/env bash
# One device call (session 20): host-code and host-setting A/Bs in one process each
# (packages/kernels-cuda/scripts/host-ab-gpu.mjs: two builds' prefills alternated from an idle
# device, paired; separate processes' from-idle plans differ by ±0.05 ms on the same code, so
# only this resolves a few hundredths), optionally after conformance and before crisp-bench runs.
#   bash apps/bench/scripts/h200-host-ab.sh OUT "A B" ["A B" ...]
# Each "A B" is two variants for host-ab-gpu.mjs, each a bundle under .device/app, optionally
# with `#sched=spin|yield|blocking|auto` (the context's scheduling flags while that build waits
# before its prefills) or `#wait=poll` (it waits by polling an event from JavaScript); builds
# that embed their kernels (0a9573f on) run their own; every pair runs in both slot orders.
#   CONF=1      conformance bf16 and f16 against float64 first (n <= 16k; ~190 s)
#   BENCH=k     then k crisp-bench runs (.device/app/crisp-bench.mjs, 128k synth from idle,
#               30 reps, each rep's plan in planRuns; BENCH_FLAGS adds flags)
#   PAIRS=200   pairs a host-ab-gpu run; N=131072
# Set up here first:
#   bash apps/bench/scripts/host-ab-pack.sh COMMIT...   (.device/app/ab-<commit>.mjs and
#                                                        host-ab-gpu.mjs)
#   ../shared/device/pack.sh tools/gpu-rig/src/cuda-main.ts   (CONF=1)
#   node apps/bench/scripts/bundle.mjs apps/bench/src/cli.ts .device/app/crisp-bench.mjs   (BENCH)
# and run with carry [".device"], CRISP_GIT_COMMIT set for crisp-bench's label. Everything goes
# under /tmp/h200-host-ab and comes back as OUT/h200-host-ab.tgz beside OUT/summary.txt. The
# call's limit is 600 s: each stage starts only with time left for it (T0-relative guards).
# Never a bare `wait` here (the tee below would be waited for too).
set -u
dest=$(realpath -m "${1:?output folder}")
shift
out=/tmp/h200-host-ab
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/h200-host-ab.tgz" -C /tmp h200-host-ab' EXIT
# shellcheck disable=SC1091
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$out/machine.txt"
if [ "${CONF:-0}" = 1 ]; then
  # shellcheck disable=SC1091
  source apps/bench/scripts/conformance.sh
  conformance_pair "$out" conf
  echo "[$(since) s] conformance done"
fi
pairs=${PAIRS:-200}
n=${N:-131072}
run=0
for pair in "$@"; do
  read -r a b <<< "$pair"
  for order in "$a $b" "$b $a"; do
    read -r x y <<< "$order"
    [ "$(since)" -gt 440 ] && { echo "[$(since) s] no time left for $x against $y"; break 2; }
    run=$((run + 1))
    echo "== run $run: A=$x B=$y"
    timeout -s KILL 150 node .device/app/host-ab-gpu.mjs ".device/app/$x" ".device/app/$y" "$n" "$pairs" > "$out/ab-$run.log" 2>&1
    echo "rc $? [$(since) s]"
    tail -n 4 "$out/ab-$run.log"
  done
done
for i in $(seq 1 "${BENCH:-0}"); do
  [ "$(since)" -gt 520 ] && { echo "[$(since) s] no time left for crisp-bench run $i"; break; }
  # shellcheck disable=SC2086
  timeout -s KILL 75 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 70 ${BENCH_FLAGS:-} \
    --out "$out/bench-$i" > "$out/bench-$i.log" 2>&1
  echo "bench-$i:"
  node apps/bench/scripts/latency-row.mjs "$out/bench-$i/bench.json" || tail -n 3 "$out/bench-$i.log"
  echo "[$(since) s]"
done
echo "done [$(since) s]"
