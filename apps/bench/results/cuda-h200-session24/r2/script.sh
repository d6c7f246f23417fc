#!/usr/bin/env bash
# session 24 r2: six from-idle crisp-bench runs of 128k (main) on another machine, then FlexPrefill at 512k once
set -u
dest=$(realpath -m "${1:?out}")
mkdir -p "$dest" /tmp/r2
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r2.tgz" -C /tmp r2' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee /tmp/r2/machine.txt
export CRISP_GIT_COMMIT=$(cat .device/commit 2>/dev/null || echo unknown)
for i in 1 2 3 4 5 6; do
  [ "$(since)" -gt 330 ] && { echo "[$(since) s] no time left for run $i"; break; }
  timeout -s KILL 75 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 70 \
    --out /tmp/r2/bench-$i > /tmp/r2/bench-$i.log 2>&1
  echo "bench-$i: [$(since) s]"
  node apps/bench/scripts/latency-row.mjs /tmp/r2/bench-$i/bench.json || tail -n 3 /tmp/r2/bench-$i.log
done
left=$((585 - $(since)))
echo "flex with ${left} s [$(since) s]"
timeout -s KILL "$left" node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
  --presets flexPrefill --max-host-values 1e12 --sizes 512k --reps 3 --warmup 1 --jit-warmup 0 --deadline-s "$left" \
  --out /tmp/r2/flex512k > /tmp/r2/flex512k.log 2>&1
echo "flex rc $? [$(since) s]"
tail -n 12 /tmp/r2/flex512k.log
node apps/bench/scripts/latency-row.mjs /tmp/r2/flex512k/bench.json
echo "done [$(since) s]"
