#!/usr/bin/env bash
# session 22 r2: expand_rows (wip/expand-rows) checked: conformance, e2e 128k and 512k, idle-trace
set -u
dest=$(realpath -m "${1:?out}")
out=/tmp/s22r2
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/s22r2.tgz" -C /tmp s22r2' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$out/machine.txt"
# e2e first (a hang in the look-back would show here, under its own limit)
e2e() { local name=$1; shift
  timeout -s KILL 130 node .device/app/cuda-device-main.mjs --phase bench --ns none --cross none --budget 120 "$@" \
    --out "$out/$name" > "$out/$name.log" 2>&1
  echo "$name rc $? [$(since) s]"
  grep -E "plan .* head start|crisp n=" "$out/$name.log" | cut -c1-900
}
e2e e2e-128k --e2e 131072 --inputs synth --headstart 3 --trace 1
timeout -s KILL 80 node .device/app/idle-trace.mjs 131072 9 > "$out/idle-trace.log" 2>&1
echo "idle-trace rc $? [$(since) s]"; cat "$out/idle-trace.log" | tail -14
source apps/bench/scripts/conformance.sh
conformance_pair "$out" conf
echo "[$(since) s] conformance done"
[ "$(since)" -lt 430 ] && e2e e2e-512k --e2e 524288 --inputs fill
echo "done [$(since) s]"
