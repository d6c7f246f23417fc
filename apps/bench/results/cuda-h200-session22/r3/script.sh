#!/usr/bin/env bash
# session 22 r3: expand_rows with 32 rows a tile (44ee1b8) checked at 128k/512k; paired A/Bs
# main (f7df64a) against 8 rows a tile (2662d70) and 32 (44ee1b8); idle-trace; crisp-bench x2
set -u
dest=$(realpath -m "${1:?out}")
out=/tmp/s22r3
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/s22r3.tgz" -C /tmp s22r3' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$out/machine.txt"
e2e() { local name=$1; shift
  timeout -s KILL 90 node .device/app/cuda-device-main.mjs --phase bench --ns none --cross none --budget 80 "$@" \
    --out "$out/$name" > "$out/$name.log" 2>&1
  echo "$name rc $? [$(since) s]"
  grep -E "crisp n=" "$out/$name.log" | cut -c1-420
}
e2e e2e-128k --e2e 131072 --inputs fill
e2e e2e-512k --e2e 524288 --inputs fill
run=0
for pair in "ab-f7df64a.mjs ab-2662d70.mjs" "ab-f7df64a.mjs ab-44ee1b8.mjs"; do
  read -r a b <<< "$pair"
  for order in "$a $b" "$b $a"; do
    read -r x y <<< "$order"
    [ "$(since)" -gt 400 ] && { echo "[$(since) s] no time left for $x against $y"; break 2; }
    run=$((run + 1))
    echo "== run $run: A=$x B=$y"
    timeout -s KILL 120 node .device/app/host-ab-gpu.mjs ".device/app/$x" ".device/app/$y" 131072 150 > "$out/ab-$run.log" 2>&1
    echo "rc $? [$(since) s]"
    tail -n 5 "$out/ab-$run.log"
  done
done
[ "$(since)" -lt 470 ] && { timeout -s KILL 60 node .device/app/idle-trace.mjs 131072 9 wg "idle,head start 3 ms" > "$out/idle-trace.log" 2>&1; echo "idle-trace rc $? [$(since) s]"; cat "$out/idle-trace.log"; }
for i in 1 2; do
  [ "$(since)" -gt 530 ] && { echo "[$(since) s] no time left for crisp-bench run $i"; break; }
  timeout -s KILL 60 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 55 \
    --out "$out/bench-$i" > "$out/bench-$i.log" 2>&1
  echo "bench-$i rc $?:"
  node apps/bench/scripts/latency-row.mjs "$out/bench-$i/bench.json" || tail -n 3 "$out/bench-$i.log"
  echo "[$(since) s]"
done
echo "done [$(since) s]"
