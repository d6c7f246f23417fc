#!/usr/bin/env bash
# session 20, call 2: crisp-bench 128k synth from idle with each run's plan, phases and GC
# pauses (planRuns), 76a086a's host (new, HEAD) against 7c2feea's (old), ABBA; two runs with a
# larger young generation; then conformance bf16/f16 for HEAD (76a086a never ran on the GPU).
set -u
dest=$(realpath -m "$1"); out=/tmp/r2; rm -rf $out; mkdir -p $out $dest
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r2.tgz" -C /tmp r2' EXIT
source .device/setup.sh
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader > "$out/machine.txt"; cat $out/machine.txt
app=$(realpath .device/app)
bench() { # NAME BUNDLE COMMIT [node flags]
  local name=$1
  CRISP_GIT_COMMIT=$3 timeout -s KILL 70 node $4 $app/crisp-bench-$2.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 60 --out "$out/$name" > "$out/$name.log" 2>&1
  node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).suites.latency.rows[0];
    const p = r.planRuns, f = (v) => v.map((x) => x.toFixed(2)).join(" ");
    console.log(`'$name': median total ${r.ms.median.toFixed(3)} ms, plan ${r.planMs.toFixed(3)} ms (${(100 * r.planMs / r.ms.median).toFixed(2)}%), stats ${r.planPhases.statsMs.toFixed(3)}, after ${r.planPhases.peRowsMs.toFixed(3)}`);
    console.log(`  plan  ${f(p.planMs)}`); console.log(`  stats ${f(p.phases.statsMs)}`); console.log(`  after ${f(p.phases.peRowsMs)}`);
    console.log(`  gc    ${p.gcMs ? f(p.gcMs) : "none"}`)' \
    "$out/$name/bench.json" 2>/dev/null || { echo "$name: no bench.json"; tail -3 "$out/$name.log"; }
}
for x in new-1:new:85cef78 old-1:old:85cef78-with-7c2feea-cuda-backend old-2:old:85cef78-with-7c2feea-cuda-backend new-2:new:85cef78 new-3:new:85cef78 old-3:old:85cef78-with-7c2feea-cuda-backend; do
  [ $(( $(date +%s) - T0 )) -gt 250 ] && { echo "out of time before $x"; break; }
  IFS=: read -r nm tr cm <<< "$x"; bench $nm $tr $cm ""; echo "[$(( $(date +%s) - T0 )) s]"
done
bench new-semi64 new 85cef78 --max-semi-space-size=64; echo "[$(( $(date +%s) - T0 )) s]"
if [ $(( $(date +%s) - T0 )) -lt 330 ]; then
  source apps/bench/scripts/conformance.sh
  conformance_pair "$out" conf
fi
echo "done [$(( $(date +%s) - T0 )) s]"
