#!/usr/bin/env bash
# One device call that checks and times the CUDA plan (sessions 9-10; results/cuda-h200-session10):
# conformance bf16 and f16 against float64 (n <= 16k, two processes), CRISP end to end on the
# synth llama-like layer at 128k and 512k with a launch trace, and crisp-bench's latency suite
# for the crisp preset at 128k (REPS runs after 5 warm-ups). Packing as in h200.sh; set
# CRISP_GIT_COMMIT. Usage: bash apps/bench/scripts/h200-check.sh OUT [conformance filter regex]
# Switches (environment): E2E, REPS, FRESH, ONLY_FRESH / SKIP_CHECKS, AB_MARKS (see below).
set -u
out=${1:?output folder}
filter=${2:-}
mkdir -p "$out"
# shellcheck disable=SC1091
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
C="node .device/app/cuda-main.mjs"
F=()
[ -n "$filter" ] && F=(--confFilter "$filter")
# ONLY_FRESH=1 or SKIP_CHECKS=1: skip the conformance, e2e and 128k latency (run only the
# FRESH and AB_MARKS parts below)
if [ -z "${ONLY_FRESH:-}${SKIP_CHECKS:-}" ]; then
# shellcheck disable=SC1091
source apps/bench/scripts/conformance.sh
conformance_pair "$out" conf "${F[@]}"
timeout -s KILL 150 $C --phase bench --ns none --cross none --e2e "${E2E:-131072,524288}" --inputs synth --trace 1 \
  --budget 140 --out "$out/e2e" > "$out/e2e.log" 2>&1
grep -E "^.{0,12}crisp n=" "$out/e2e.log" | cut -c1-600
grep -E "trace 131072 .*(attn_|timings|pass1f|expand_write)" "$out/e2e.log" | cut -c1-200
timeout -s KILL 150 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth --presets crisp \
  --max-host-values 1e12 --sizes 128k --reps "${REPS:-30}" --warmup 5 --deadline-s 140 --out "$out/bench-crisp" \
  > "$out/bench.log" 2>&1
grep -E "latency" "$out/bench.log" | tail -n 4
fi
# FRESH=1: the same size with q, k and v marked rewritten before every run (--fresh-inputs),
# and with .device/app/crisp-bench-mid.mjs and crisp-bench-old.mjs as well when present (bundles of earlier commits,
# for a before/after in the same call).
if [ -n "${FRESH:-}" ]; then
  for b in crisp-bench crisp-bench-mid crisp-bench-old; do
    [ -f ".device/app/$b.mjs" ] || continue
    timeout -s KILL 120 node ".device/app/$b.mjs" --backends cuda --suites latency --latency-inputs synth --presets crisp \
      --max-host-values 1e12 --sizes 128k --reps 10 --warmup 3 --fresh-inputs --deadline-s 110 --out "$out/fresh-$b" \
      > "$out/fresh-$b.log" 2>&1
    echo "$b:"; grep -E "latency cuda n=131072 crisp" "$out/fresh-$b.log" | tail -n 1
  done
fi
# AB_MARKS=1: crisp and dense at 8k-64k with the device marks (default) and with --host-timings,
# one bundle, to see what marking the device timeline costs (session 10's headline had the small
# sizes 0.25-0.40 ms slower than session 9's; NOTES.md).
if [ -n "${AB_MARKS:-}" ]; then
  for mode in marks host; do
    extra=()
    [ "$mode" = host ] && extra=(--host-timings)
    timeout -s KILL 150 node .device/app/crisp-bench.mjs --backends cuda --suites latency --latency-inputs synth \
      --presets dense,crisp --max-host-values 1e12 --sizes 8k..64k --reps 10 --warmup 3 "${extra[@]}" --deadline-s 140 \
      --out "$out/ab-$mode" > "$out/ab-$mode.log" 2>&1
    echo "$mode:"; grep -E "latency cuda n=[0-9]+ (dense|crisp):" "$out/ab-$mode.log"
  done
fi
