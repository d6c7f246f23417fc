#!/usr/bin/env bash
# session 21, call 2: f16 conformance alone (r1's was killed one case short), `crisp run` (the
# README's main job) with this tree, then crisp-bench 128k synth x2 (30 and 80 reps) with the
# GPU's clocks, power and clock-event reasons sampled every 20 ms (do the slower last reps come
# with a lower SM clock?)
set -u
dest=$(realpath -m "${1:?out}")
out=/tmp/s21r2
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/s21r2.tgz" -C /tmp s21r2' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,power.max_limit --format=csv,noheader | tee "$out/gpu.txt"
F=timestamp,clocks.sm,clocks.mem,power.draw.instant,temperature.gpu,clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown
nvidia-smi --query-gpu=$F --format=csv,noheader | tee "$out/smi-probe.txt" || F=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active
timeout -s KILL 240 node .device/app/cuda-device-main.mjs --phase conformance --dtypes f16 --confMaxN 16384 --budget 230 --out "$out/conf-f16" > "$out/conf-f16.log" 2>&1
echo "conf rc $? [$(since) s]"; grep -h "conformance cuda:" "$out/conf-f16.log"; grep -h FAIL "$out/conf-f16.log" | head
timeout -s KILL 120 node .device/app/crisp.mjs run > "$out/crisp-run.log" 2>&1
echo "crisp run rc $? [$(since) s]"; tail -n 25 "$out/crisp-run.log"
i=0
for reps in 30 80; do
  i=$((i + 1))
  [ "$(since)" -gt 420 ] && { echo "no time for bench $i"; break; }
  nvidia-smi --query-gpu=$F --format=csv,noheader -lms 20 > "$out/smi-$i.csv" 2>&1 &
  smi=$!
  timeout -s KILL 130 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps $reps --warmup 3 --deadline-s 120 \
    --out "$out/bench-$i" > "$out/bench-$i.log" 2>&1
  echo "bench-$i rc $? [$(since) s]"
  kill "$smi"
  node apps/bench/scripts/latency-row.mjs "$out/bench-$i/bench.json" || tail -n 3 "$out/bench-$i.log"
  grep -c . "$out/smi-$i.csv"
done
echo "done [$(since) s]"
