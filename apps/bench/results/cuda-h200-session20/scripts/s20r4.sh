#!/usr/bin/env bash
set -u
dest=$(realpath -m "$1"); out=/tmp/r4; rm -rf $out; mkdir -p $out $dest
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r4.tgz" -C /tmp r4' EXIT
source .device/setup.sh
T0=$(date +%s)
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader > "$out/machine.txt"; cat $out/machine.txt
app=$(realpath .device/app)
for i in 1 2 3 4; do
  [ $(( $(date +%s) - T0 )) -gt 150 ] && { echo "out of time before $i"; break; }
  name=head-$i
  CRISP_GIT_COMMIT=$2 timeout -s KILL 100 node $app/crisp-bench-new.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 30 --warmup 3 --deadline-s 95 --out "$out/$name" > "$out/$name.log" 2>&1
  node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).suites.latency.rows[0];
    const p = r.planRuns, f = (v) => v.map((x) => x.toFixed(2)).join(" ");
    console.log(`'$name': median total ${r.ms.median.toFixed(3)} ms, plan ${r.planMs.toFixed(3)} ms (${(100 * r.planMs / r.ms.median).toFixed(2)}%), stats ${r.planPhases.statsMs.toFixed(3)}, after ${r.planPhases.peRowsMs.toFixed(3)}`);
    console.log(`  plan  ${f(p.planMs)}`); console.log(`  gc    ${p.gcMs ? f(p.gcMs) : "none"}`)' \
    "$out/$name/bench.json" 2>/dev/null || { echo "$name: no bench.json"; tail -3 "$out/$name.log"; }
  echo "[$(( $(date +%s) - T0 )) s]"
done
