#!/usr/bin/env bash
# session 24 r1: FlexPrefill at 512k once, then from-idle crisp-bench runs of 128k (main) while time lasts
set -u
dest=$(realpath -m "${1:?out}")
mkdir -p "$dest" /tmp/r1
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r1.tgz" -C /tmp r1' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
export CRISP_GIT_COMMIT=$(cat .device/commit 2>/dev/null || echo unknown)
timeout -s KILL 130 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
  --presets flexPrefill --max-host-values 1e12 --sizes 512k --reps 3 --warmup 1 --jit-warmup 0 --deadline-s 120 \
  --out /tmp/r1/flex512k > /tmp/r1/flex512k.log 2>&1
echo "flex rc $? [$(since) s]"
tail -n 12 /tmp/r1/flex512k.log
node apps/bench/scripts/latency-row.mjs /tmp/r1/flex512k/bench.json
for i in 1 2 3 4 5 6; do
  [ "$(since)" -gt 500 ] && { echo "[$(since) s] no time left for run $i"; break; }
  timeout -s KILL 75 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 70 \
    --out /tmp/r1/bench-$i > /tmp/r1/bench-$i.log 2>&1
  echo "bench-$i: [$(since) s]"
  node apps/bench/scripts/latency-row.mjs /tmp/r1/bench-$i/bench.json || tail -n 3 /tmp/r1/bench-$i.log
done
echo "done [$(since) s]"
