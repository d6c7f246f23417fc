#!/usr/bin/env bash
# session 22 r5: the host path to the pass's launch after 300 and 2000 warm-up prefills (stamps,
# wip/stamps), and crisp-bench 128k from idle with its default JIT warm-up (300) and 2000, ABAB
set -u
dest=$(realpath -m "${1:?out}")
out=/tmp/s22r5
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/s22r5.tgz" -C /tmp s22r5' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$out/machine.txt"
for w in 300 2000; do
  timeout -s KILL 120 node .device/app/stamps-gpu.mjs 131072 100 $w > "$out/stamps-$w.log" 2>&1
  echo "stamps warm $w rc $? [$(since) s]"; cat "$out/stamps-$w.log"
done
i=0
for jw in 300 2000 300 2000; do
  i=$((i + 1))
  [ "$(since)" -gt 520 ] && { echo "[$(since) s] no time left for bench $i"; break; }
  timeout -s KILL 75 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 70 --jit-warmup $jw \
    --out "$out/bench-$i-jw$jw" > "$out/bench-$i-jw$jw.log" 2>&1
  echo "bench-$i jit-warmup $jw rc $?:"
  node apps/bench/scripts/latency-row.mjs "$out/bench-$i-jw$jw/bench.json" | head -2 || tail -n 3 "$out/bench-$i-jw$jw.log"
  echo "[$(since) s]"
done
echo "done [$(since) s]"
