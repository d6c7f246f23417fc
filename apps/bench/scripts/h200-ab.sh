#!/usr/bin/env bash
# One device call (session 14): this tree checked, then timed against an earlier commit in the
# same call (between calls the 128k plan moves by +-0.05 ms, so only same-call A/Bs count).
#   checks (CHECKS, comma-separated, default conf,proxy,e2e): conformance bf16 and f16 against
#     float64 (n <= 16k), beside the proxy statistics' checks (small shapes and 128k against
#     float64, 512k fused vs two-pass); CRISP end to end at 128k on the synth layer with a 3 ms
#     device head start, for this tree and the earlier one (E2E_ARGS adds flags; E2E_BIG=1 adds
#     this tree at 512k on the device fill); `bits` (not by default): the statistics of one
#     input through the earlier tree's kernels and this one's, compared byte for byte.
#   A/B: crisp-bench --presets crisp --sizes 128k, the earlier bundle then this one, AB_ROUNDS
#     rounds (default 2) on each of AB_INPUTS (default synth); AB_FLAGS is passed to both (the
#     earlier bundle must know the flags), BASE_FLAGS to the earlier side only (e.g. `--cuda-pdl
#     off` when the earlier kernels lack CRISP_PDL_ENTRY and one bundle serves both sides);
#     AB_ORDER=abba alternates which one goes first.
#   Never a bare `wait` in these scripts: it also waits for the `tee` below, for ever (session
#   17's r6 spent its device time that way); wait for the background jobs' pids.
# Set up first (packing as in h200.sh), BASE naming the earlier commit (default old):
#   .device/app/crisp-bench.mjs, .device/app/crisp-bench-$BASE.mjs   the two bundles
#   .device/app/cuda-main-$BASE.mjs                          (e2e) the earlier bundle
#   .device/$BASE/, .device/new/   each commit's packages/kernels-cuda/kernels and a
#                                  pnpm-workspace.yaml (crisp-bench's repository root; both run
#                                  without the PyTorch peer)
# Usage: bash apps/bench/scripts/h200-ab.sh OUT   (set CRISP_GIT_COMMIT to this tree's commit and
# BASE_COMMIT to the earlier one: each bundle's results are labelled with its own; session 16's
# r2 ran before BASE_COMMIT existed and its earlier runs were relabelled by hand)
# Everything is written under /tmp/h200-ab and comes back as OUT/h200-ab.tgz (the device tool
# returns at most 8 files), beside OUT/summary.txt (what this script prints).
set -u
dest=$(realpath -m "${1:?output folder}")
base=${BASE:-old}
checks=,${CHECKS-conf,proxy,e2e},
mkdir -p "$dest"
out=/tmp/h200-ab
rm -rf "$out" && mkdir -p "$out"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/h200-ab.tgz" -C /tmp h200-ab' EXIT
# shellcheck disable=SC1091
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
# What may tell one call's machine from another's (from an idle device the 128k plan reads
# 0.03-0.06 ms apart between calls for the same kernels, session 18): the GPU's clocks and
# limits, its serial, the host's CPU
{
  nvidia-smi --query-gpu=serial,pci.bus_id,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,temperature.gpu --format=csv
  # (a separate query: older drivers name this field clocks_throttle_reasons.active)
  nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)|MHz"
} > "$out/machine.txt" 2>&1
app=$(realpath .device/app)
C="node $app/cuda-main.mjs"
pids=()
if [[ $checks == *,proxy,* ]]; then
  (
    timeout -s KILL 150 $C --phase proxy --proxyNs 131072 --proxyLayouts w32,wg --budget 140 --out "$out/proxy-128k" > "$out/proxy-128k.log" 2>&1
    timeout -s KILL 60 $C --phase proxy --proxySmall 0 --proxyRef 0 --proxyNs 524288 --proxyLayouts wg --budget 55 --out "$out/proxy-512k" > "$out/proxy-512k.log" 2>&1
  ) &
  pids+=($!)
fi
if [[ $checks == *,bits,* ]]; then
  # the statistics of one input (stats-dump: llama fill, 128k) through each tree's kernels,
  # compared byte for byte (a change meant to keep every bit; BITS_LAYOUTS, default wg, is
  # stats-dump's layout list, e.g. wg-nopdl for kernels without the device-side wait)
  for w in "$base" new; do
    (cd ".device/$w" && timeout -s KILL 120 node "$app/stats-dump.mjs" "$out/bits-$w" 131072 "${BITS_LAYOUTS:-wg}" > "$out/bits-$w.log" 2>&1)
    echo "bits $w: rc $? $(head -c 300 "$out/bits-$w.log")"
  done
  for f in "$out/bits-$base".*.f64; do
    g=$out/bits-new${f#"$out/bits-$base"}
    if cmp -s "$f" "$g"; then echo "bits ${g##*/}: identical ($(stat -c %s "$f") bytes)"; else echo "bits ${g##*/}: DIFFER"; fi
  done
  rm -f "$out"/bits-*.f64
fi
if [[ $checks == *,conf,* ]]; then
  # shellcheck disable=SC1091
  source apps/bench/scripts/conformance.sh
  conformance_pair "$out" conf
fi
# (a bare `wait` would also wait for the tee above, for ever)
for p in "${pids[@]}"; do wait "$p"; done
[[ $checks == *,proxy,* ]] && grep -hE "PASS|FAIL|bit diffs|fused vs two-pass" "$out"/proxy-*.log | cut -c1-400
if [[ $checks == *,e2e,* ]]; then
  e2e() { # NAME DIR BUNDLE [flags]
    local name=$1 dir=$2 bundle=$3
    shift 3
    # shellcheck disable=SC2086
    (cd "$dir" && timeout -s KILL 110 node "$bundle" --phase bench --ns none --cross none --budget 100 "$@" ${E2E_ARGS:-} \
      --out "$out/$name" > "$out/$name.log" 2>&1)
    echo "$name:"
    grep -E "plan .* head start|crisp n=" "$out/$name.log" | cut -c1-700
  }
  e2e e2e-new . "$app/cuda-main.mjs" --e2e 131072 --inputs synth --headstart 3
  [ -f "$app/cuda-main-$base.mjs" ] && e2e "e2e-$base" ".device/$base" "$app/cuda-main-$base.mjs" --e2e 131072 --inputs synth --headstart 3
  [ -n "${E2E_BIG:-}" ] && e2e e2e-new-512k . "$app/cuda-main.mjs" --e2e 524288 --inputs fill
fi
bench() { # NAME DIR BUNDLE INPUTS [flags]
  local name=$1 dir=$2 bundle=$3 inputs=$4
  shift 4
  # shellcheck disable=SC2086
  (cd "$dir" && timeout -s KILL 100 node "$bundle" --backends cuda --suites latency --latency-inputs "$inputs" \
    --presets crisp --max-host-values 1e12 --sizes 128k --reps 20 --warmup 3 --deadline-s 90 ${AB_FLAGS:-} "$@" \
    --out "$out/$name" > "$out/$name.log" 2>&1)
  echo "$name: $(grep -E "latency cuda n=131072 crisp" "$out/$name.log" | tail -n 1)"
  # the medians unrounded
  node apps/bench/scripts/latency-row.mjs "$out/$name/bench.json"
}
# AB_ORDER=abba: the earlier bundle first in odd rounds, this one first in even rounds (session
# 17: a fixed order can put a drift between calls' minutes on one side)
for inputs in ${AB_INPUTS:-synth}; do
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    if [[ ${AB_ORDER:-ab} == abba && $((r % 2)) -eq 0 ]]; then
      bench "new-$inputs-$r" .device/new "$app/crisp-bench.mjs" "$inputs"
      # shellcheck disable=SC2086
      CRISP_GIT_COMMIT=${BASE_COMMIT:-$base} bench "$base-$inputs-$r" ".device/$base" "$app/crisp-bench-$base.mjs" "$inputs" ${BASE_FLAGS:-}
    else
      # shellcheck disable=SC2086
      CRISP_GIT_COMMIT=${BASE_COMMIT:-$base} bench "$base-$inputs-$r" ".device/$base" "$app/crisp-bench-$base.mjs" "$inputs" ${BASE_FLAGS:-}
      bench "new-$inputs-$r" .device/new "$app/crisp-bench.mjs" "$inputs"
    fi
  done
done
