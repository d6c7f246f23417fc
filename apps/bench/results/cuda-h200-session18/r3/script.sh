#!/usr/bin/env bash
# session 18, call 3: programmatic launches (PDL) for the chain after the proxy pass: bits on/off,
# conformance and proxy checks with it on, e2e 128k behind a head start on/off, crisp-bench 128k
# from idle against 1ff4b0a (base: its kernels, plain launches). Never a bare `wait` here.
set -u
dest=$(realpath -m "$1"); out=/tmp/r3; rm -rf $out; mkdir -p $out $dest
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r3.tgz" -C /tmp r3' EXIT
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
app=$(realpath .device/app)
C="node $app/cuda-device-main.mjs"
echo "== 1 bits: stats-dump 128k llama fill, wg with and without programmatic launches"
timeout -s KILL 120 node $app/stats-dump.mjs $out/sd 131072 wg,wg-nopdl > $out/stats-dump.log 2>&1; echo "rc $?"
cut -c1-300 $out/stats-dump.log; rm -f $out/*.f64
echo "== 2 conformance bf16/f16 (programmatic launches on) and the proxy checks"
( timeout -s KILL 150 $C --phase proxy --proxyNs 131072 --proxyLayouts w32,wg --budget 140 --out $out/proxy-128k > $out/proxy-128k.log 2>&1 ) &
ppid=$!
source apps/bench/scripts/conformance.sh
conformance_pair "$out" conf
wait $ppid
grep -hE "programmatic|PASS|FAIL|bit diffs|wg lean" $out/proxy-128k.log | cut -c1-300
echo "== 3 e2e 128k synth, behind a 3 ms head start: on, off"
for m in on off; do
  timeout -s KILL 100 $C --phase bench --ns none --cross none --budget 90 --e2e 131072 --inputs synth --headstart 3 --pdl $m --out $out/e2e-$m > $out/e2e-$m.log 2>&1
  echo "pdl $m:"; grep -E "programmatic|plan .* head start|crisp n=" $out/e2e-$m.log | cut -c1-600
done
echo "== 4 crisp-bench 128k synth from idle"
bench() { # NAME DIR COMMIT [flags]
  local name=$1 dir=$2 commit=$3; shift 3
  (cd "$dir" && CRISP_GIT_COMMIT=$commit timeout -s KILL 100 node $app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 20 --warmup 3 --deadline-s 90 "$@" --out "$out/$name" > "$out/$name.log" 2>&1)
  node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).suites.latency.rows[0];
    console.log(`'$name': median total ${r.ms.median.toFixed(3)} ms, plan ${r.planMs.toFixed(3)} ms (${(100 * r.planMs / r.ms.median).toFixed(2)}%), stats ${r.planPhases.statsMs.toFixed(3)}, after ${r.planPhases.peRowsMs.toFixed(3)}`)' \
    "$out/$name/bench.json" 2>/dev/null || { echo "$name: no bench.json"; tail -3 "$out/$name.log"; }
}
bench base-1 .device/base 1ff4b0a --cuda-pdl off
bench new-1 .device/new "$CRISP_GIT_COMMIT"
bench nopdl-1 .device/new "$CRISP_GIT_COMMIT" --cuda-pdl off
bench new-2 .device/new "$CRISP_GIT_COMMIT"
bench base-2 .device/base 1ff4b0a --cuda-pdl off
