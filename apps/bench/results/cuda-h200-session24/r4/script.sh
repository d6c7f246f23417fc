#!/usr/bin/env bash
# session 24 r4: from-idle crisp-bench runs of 128k (main) on a third machine while time lasts
set -u
dest=$(realpath -m "${1:?out}")
mkdir -p "$dest" /tmp/r4
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r4.tgz" -C /tmp r4' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee /tmp/r4/machine.txt
export CRISP_GIT_COMMIT=$(cat .device/commit 2>/dev/null || echo unknown)
for i in 1 2 3 4 5 6 7 8 9 10; do
  if [ "$i" = 1 ]; then lim=130; else lim=75; fi
  [ $(( $(since) + lim )) -gt 540 ] && { echo "[$(since) s] no time left for run $i"; break; }
  timeout -s KILL "$lim" node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s $((lim - 5)) \
    --out /tmp/r4/bench-$i > /tmp/r4/bench-$i.log 2>&1
  echo "bench-$i: [$(since) s]"
  node apps/bench/scripts/latency-row.mjs /tmp/r4/bench-$i/bench.json || tail -n 3 /tmp/r4/bench-$i.log
done
echo "done [$(since) s]"
