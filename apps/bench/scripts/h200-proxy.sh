#!/usr/bin/env bash
# One device call for a proxy-pass change (session 11): the proxy statistics against float64
# (small shapes, every layout, fused and two-pass; 128k) and timed at 128k and 512k; the same
# timings from an earlier commit's bundle when .device/app/cuda-main-old.mjs and its
# kernels (.device/old/packages/kernels-cuda/kernels) are there, for a before/after in one call;
# Nsight Compute's instruction counts of the fused pass (h200-profile.sh); CRISP end to end at
# 128k with a launch trace; then, if nothing failed, conformance bf16 and f16 (n <= 16k; NOCONF=1
# skips it).
# Packing as in h200.sh; set CRISP_GIT_COMMIT. Usage: bash apps/bench/scripts/h200-proxy.sh OUT
set -u
out=${1:?output folder}
mkdir -p "$out"
# shellcheck disable=SC1091
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
C="node .device/app/cuda-main.mjs"
# PROXY_ARGS: more cuda-main arguments for the 128k call (--proxyRef 0: no float64 check at 128k, ~25 s)
# shellcheck disable=SC2086
timeout -s KILL 120 $C --phase proxy --proxyNs 131072 --proxyLayouts w32,wg --budget 110 ${PROXY_ARGS:-} \
  --out "$out/proxy-128k" > "$out/proxy-128k.log" 2>&1
# NO512=1: no 512k proxy timings
[ -z "${NO512:-}" ] && timeout -s KILL 80 $C --phase proxy --proxySmall 0 --proxyNs 524288 --proxyRef 0 --proxyLayouts w32,wg \
  --budget 70 --out "$out/proxy-512k" > "$out/proxy-512k.log" 2>&1
grep -hE "proxy n=|FAIL|ERROR" "$out"/proxy-*.log | cut -c1-330
if [ -f .device/app/cuda-main-old.mjs ]; then
  for n in 131072 524288; do
    (cd .device/old && timeout -s KILL 80 node ../app/cuda-main-old.mjs --phase proxy --proxySmall 0 --proxyNs $n \
      --proxyRef 0 --proxyLayouts wg --budget 70 --out "$out/old-proxy-$n") > "$out/old-proxy-$n.log" 2>&1
  done
  echo "old:"; grep -hE "proxy n=" "$out"/old-proxy-*.log | cut -c1-330
fi
# NOPROF=1: no Nsight Compute profile (~2 min)
if [ -z "${NOPROF:-}" ]; then
  bash apps/bench/scripts/h200-profile.sh "$out/profile" > "$out/profile.log" 2>&1
  grep -E "Duration|Executed Instructions  |Issue Slots" "$out/profile/details.txt"
fi
# E2E_ARGS: more arguments for the 128k end-to-end call (--headstart 3: the plan behind a device wait)
# shellcheck disable=SC2086
timeout -s KILL 120 $C --phase bench --ns none --cross none --e2e 131072 --inputs synth --trace 1 ${E2E_ARGS:-} \
  --budget 110 --out "$out/e2e" > "$out/e2e.log" 2>&1
grep -E "^.{0,12}crisp n=" "$out/e2e.log" | cut -c1-500
grep -E "trace 131072 .*(attn_|timings|pass1f|expand_write)" "$out/e2e.log" | cut -c1-200
if grep -qE "FAIL|ERROR in proxy_small" "$out"/proxy-*.log; then
  echo "proxy checks failed: conformance skipped"
  LATENCY= ; exit 1
fi
# NOCONF=1: a timing call that leaves conformance for a later one
if [ -z "${NOCONF:-}" ]; then
  # shellcheck disable=SC1091
  source apps/bench/scripts/conformance.sh
  conformance_pair "$out" conf
fi
# LATENCY=1: crisp-bench's latency for the crisp preset at 128k (REPS runs) and 512k (5 runs),
# this tree and, when .device/app/crisp-bench-old.mjs is there, the earlier bundle (run from
# .device/old, which needs pnpm-workspace.yaml and the old kernels) right after it.
if [ -n "${LATENCY:-}" ]; then
  lat() { # $1 label, $2 bundle, $3 cwd
    for s in 128k 512k; do
      # 512k: ~112 s of the call goes to generating the synth inputs on the host
      r=${REPS:-30}; t=120; [ $s = 512k ] && r=5 && t=200
      (cd "$3" && timeout -s KILL $t node "$2" --backends cuda --suites latency --latency-inputs synth --presets crisp \
        --max-host-values 1e12 --sizes $s --reps $r --warmup 5 --deadline-s $((t - 10)) --out "$out/lat-$1-$s") \
        > "$out/lat-$1-$s.log" 2>&1
      echo "$1 $s:"; grep -E "latency cuda n=[0-9]+ crisp:" "$out/lat-$1-$s.log" | tail -n 1
    done
  }
  lat new "$PWD/.device/app/crisp-bench.mjs" "$PWD"
  # NOOLDLAT=1: this tree only
  [ -z "${NOOLDLAT:-}" ] && [ -f .device/app/crisp-bench-old.mjs ] && lat old "$PWD/.device/app/crisp-bench-old.mjs" "$PWD/.device/old"
fi
