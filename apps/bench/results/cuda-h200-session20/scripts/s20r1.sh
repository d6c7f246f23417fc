#!/usr/bin/env bash
# session 20, call 1: 76a086a's host walk over kept statistics (new) against 7c2feea's (old),
# the same kernels: host-cost-gpu from idle, then crisp-bench 128k synth from idle, ABBA.
set -u
dest=$(realpath -m "$1"); out=/tmp/r1; rm -rf $out; mkdir -p $out $dest
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r1.tgz" -C /tmp r1' EXIT
source .device/setup.sh
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader > "$out/machine.txt"; cat $out/machine.txt
app=$(realpath .device/app)
for t in old new old new; do
  [ $(( $(date +%s) - T0 )) -gt 200 ] && { echo "out of time before hcg $t"; break; }
  timeout -s KILL 90 node $app/hcg-$t.mjs 131072 80 >> $out/hcg-$t.log 2>&1; echo "hcg $t rc $? [$(( $(date +%s) - T0 )) s]"
  grep -E "host queues" $out/hcg-$t.log | tail -2
done
bench() { # NAME BUNDLE COMMIT
  local name=$1
  CRISP_GIT_COMMIT=$3 timeout -s KILL 70 node $app/crisp-bench-$2.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 20 --warmup 3 --deadline-s 60 --out "$out/$name" > "$out/$name.log" 2>&1
  node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).suites.latency.rows[0];
    console.log(`'$name': median total ${r.ms.median.toFixed(3)} ms, plan ${r.planMs.toFixed(3)} ms (${(100 * r.planMs / r.ms.median).toFixed(2)}%), stats ${r.planPhases.statsMs.toFixed(3)}, after ${r.planPhases.peRowsMs.toFixed(3)}`)' \
    "$out/$name/bench.json" 2>/dev/null || { echo "$name: no bench.json"; tail -3 "$out/$name.log"; }
}
for x in new-1:new:4ac4bd9 old-1:old:7c2feea old-2:old:7c2feea new-2:new:4ac4bd9 new-3:new:4ac4bd9 old-3:old:7c2feea new-4:new:4ac4bd9 old-4:old:7c2feea; do
  [ $(( $(date +%s) - T0 )) -gt 480 ] && { echo "out of time before $x"; break; }
  IFS=: read -r nm tr cm <<< "$x"; bench $nm $tr $cm
done
echo "done [$(( $(date +%s) - T0 )) s]"
