#!/usr/bin/env bash
# One device call (session 14): this tree checked, then crisp-bench's 128k crisp latency timed
# against an earlier commit's in the same call.
#   checks: conformance bf16 and f16 against float64 (n <= 16k) beside the proxy statistics'
#   checks (small shapes and 128k against float64; 512k fused vs two-pass), then CRISP end to
#   end at 128k on the synth layer with a 3 ms device head start (E2E_ARGS adds flags).
#   A/B: crisp-bench --presets crisp --sizes 128k, alternating the earlier bundle (cold JIT, as it
#   ran) with this one cold (--jit-warmup 0) and warm (the default), on the device's llama fill
#   (AB_ROUNDS rounds, default 2), then once each on the synth layer.
# Set up first (see h200.sh for packing):
#   .device/app/crisp-bench.mjs      this tree's bundle (apps/bench/scripts/bundle.mjs)
#   .device/app/crisp-bench-old.mjs  the earlier commit's bundle
#   .device/old/                     that commit's packages/kernels-cuda/kernels and a
#                                    pnpm-workspace.yaml (its repository root for crisp-bench)
#   .device/new/                     the same for this tree (both run without the PyTorch peer)
# Usage: bash apps/bench/scripts/h200-ab.sh OUT   (set CRISP_GIT_COMMIT)
set -u
out=$(realpath -m "${1:?output folder}")
mkdir -p "$out"
# shellcheck disable=SC1091
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
C="node .device/app/cuda-device-main.mjs"
if [ -z "${SKIP_CHECKS:-}" ]; then
  (
    timeout -s KILL 150 $C --phase proxy --proxyNs 131072 --proxyLayouts w32,wg --budget 140 --out "$out/proxy-128k" > "$out/proxy-128k.log" 2>&1
    timeout -s KILL 60 $C --phase proxy --proxySmall 0 --proxyRef 0 --proxyNs 524288 --proxyLayouts wg --budget 55 --out "$out/proxy-512k" > "$out/proxy-512k.log" 2>&1
  ) &
  # shellcheck disable=SC1091
  source apps/bench/scripts/conformance.sh
  conformance_pair "$out" conf
  wait
  grep -hE "PASS|FAIL|bit diffs|fused vs two-pass" "$out"/proxy-*.log | cut -c1-400
  # shellcheck disable=SC2086
  timeout -s KILL 100 $C --phase bench --ns none --cross none --e2e 131072 --inputs synth --headstart 3 ${E2E_ARGS:-} \
    --budget 90 --out "$out/e2e" > "$out/e2e.log" 2>&1
  grep -E "plan .* head start|crisp n=" "$out/e2e.log" | cut -c1-700
fi
bench() { # NAME DIR BUNDLE INPUTS [extra flags]
  local name=$1 dir=$2 bundle=$3 inputs=$4
  shift 4
  (cd "$dir" && timeout -s KILL 100 node "$bundle" --backends cuda --suites latency --latency-inputs "$inputs" \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 20 --warmup 3 --deadline-s 90 "$@" \
    --out "$out/$name" > "$out/$name.log" 2>&1)
  echo "$name: $(grep -E "latency cuda n=131072 crisp" "$out/$name.log" | tail -n 1)"
}
app=$(realpath .device/app)
for r in $(seq 1 "${AB_ROUNDS:-2}"); do
  bench "old-fill-$r" .device/old "$app/crisp-bench-old.mjs" fill
  bench "cold-fill-$r" .device/new "$app/crisp-bench.mjs" fill --jit-warmup 0
  bench "warm-fill-$r" .device/new "$app/crisp-bench.mjs" fill
done
bench old-synth .device/old "$app/crisp-bench-old.mjs" synth
bench warm-synth .device/new "$app/crisp-bench.mjs" synth
