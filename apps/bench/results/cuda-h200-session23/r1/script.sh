#!/usr/bin/env bash
# session 23 r1: host stamps after W = 300 / 2000 / 5000 JIT warm-up prefills, then six crisp-bench
# runs of 128k synth from idle (default JIT warm-up 2000). Prints as it goes.
set -u
dest=$(realpath -m "${1:?out}")
out=/tmp/s23r1
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/s23r1.tgz" -C /tmp s23r1' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$out/machine.txt"
for w in 300 2000 5000; do
  timeout -s KILL 110 node .device/app/stamps23.mjs 131072 100 $w 2>&1 | tee "$out/stamps-$w.log"
  echo "stamps W=$w rc $? [$(since) s]"
done
for i in 1 2 3 4 5 6; do
  [ "$(since)" -gt 520 ] && { echo "[$(since) s] no time left for bench $i"; break; }
  timeout -s KILL 75 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 70 \
    --out "$out/bench-$i" > "$out/bench-$i.log" 2>&1
  echo "bench-$i rc $?:"
  node apps/bench/scripts/latency-row.mjs "$out/bench-$i/bench.json" | head -2 || tail -n 3 "$out/bench-$i.log"
  echo "[$(since) s]"
done
echo "done [$(since) s]"
