#!/usr/bin/env bash
# The H200 runs behind the committed results, one device call per phase (the GPU machine has
# no Node: everything comes bundled in .device/, see ../README.md "Reproduce the H200 results").
#
# Here (a machine with pnpm):
#   pnpm install --frozen-lockfile && pnpm -r build
#   bash ../shared/device/pack.sh packages/kernels-cuda/device/cuda-device-main.ts \
#     tools/gpu-rig/src/webgpu-main.ts
#   node apps/bench/scripts/bundle.mjs apps/bench/src/cli.ts .device/app/crisp-bench.mjs
# There (device tool, carry .device, from the repository root):
#   bash apps/bench/scripts/h200.sh cuda /tmp/o           # ~150 s: conformance, suites, exactness vs SDPA
#   bash apps/bench/scripts/h200.sh cuda-plan /tmp/o      # ~450 s (E2E=131072) / ~650 s: proxy layouts, fused and two-pass, conformance, e2e
#   bash apps/bench/scripts/h200.sh cuda-latency /tmp/o   # ~310 s: CRISP vs dense vs SDPA, 8k-512k
#   bash apps/bench/scripts/h200.sh cuda-kernels /tmp/o   # ~80 s: attention layouts vs v1
#   bash apps/bench/scripts/h200.sh webgpu /tmp/o         # ~250 s: dense 8k-64k, conformance, sparse, TF.js
#   bash apps/bench/scripts/h200.sh webgpu-latency /tmp/o # ~130 s: crisp-bench WebGPU latency
#   then: tar czf "$OUT/o.tgz" -C /tmp/o .   (the device tool returns at most 8 files)
# Session 6 ran cuda-latency as written (17ece4d) and cuda-plan's steps as three custom calls
# (results/cuda-h200-session6/README.md); a last cuda-plan with E2E=131072 checked the final
# commit. Session 5 ran webgpu, cuda-latency and webgpu-latency as written (eb7dad5 / de95cb5); its
# CUDA conformance, e2e and profile steps were one custom call (the commands are in
# results/cuda-h200-session5/README.md). cuda ran as written at 8da5d7a; cuda-kernels folds in
# session 4's commands with a shorter layout list.
# Set CRISP_GIT_COMMIT to the commit being run (the GPU machine's git metadata can be stale).
# The device runs the working copy's packages/kernels-cuda/kernels/*.cu (compiled there by
# NVRTC) and the bundles in .device/app: build and pack from a clean tree, or from a clean
# checkout of the commit copied over (session 3 did the latter while others were editing),
# or the results will not be the commit's.
# Then copy $OUT's folders over apps/bench/results/ unedited.
#
# Phases are separated with ';' so a step killed at its limit never stops the next one;
# every step writes its results progressively.
set -u
phase=${1:?phase: cuda or webgpu}
out=${2:?output folder}
mkdir -p "$out"
# shellcheck disable=SC1091
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
CUDA="node .device/app/cuda-device-main.mjs"
BENCH="node .device/app/crisp-bench.mjs"

case "$phase" in
  cuda)
    # 1. In parallel (correctness only, nothing timed): conformance against the float64
    #    reference up to n = 16k, bf16 and f16 as two processes (the host-side reference is
    #    the slow part; the cubin cache is written atomically), and crisp-bench's accuracy,
    #    O(n) and floors suites on both GPU backends (host float64 scoring).
    D="$out/nvidia-h200"
    mkdir -p "$D"
    timeout -s KILL 200 $BENCH --backends cuda,webgpu --suites accuracy,onCurve,floors --acc-sizes 8k,16k \
      --proxy-sizes 4k..128k --floors-n 8k --deadline-s 190 --merge --out "$D" > "$out/suites.log" 2>&1 &
    timeout -s KILL 250 $CUDA --phase conformance --dtypes bf16 --confMaxN 16384 --budget 240 \
      --out "$out/cuda-conformance-bf16" > "$out/cuda-conformance-bf16.log" 2>&1 &
    sleep 15
    timeout -s KILL 250 $CUDA --phase conformance --dtypes f16 --confMaxN 16384 --budget 235 \
      --out "$out/cuda-conformance-f16" > "$out/cuda-conformance-f16.log" 2>&1
    wait
    tail -n 3 "$out"/cuda-conformance-*.log "$out/suites.log"
    # 2. Exactness at 64k and 128k: sparse (full mask) vs dense, and rows of both against
    #    PyTorch SDPA (flash, cuDNN) and float64 on identical (hash-formula) inputs.
    timeout -s KILL 60 $CUDA --phase bench --ns 65536,131072 --e2e none --cross none --budget 50 \
      --out "$out/cuda-exactness" 2>&1 | grep -v '^\[.*done' | tail -n 3
    timeout -s KILL 60 python3 apps/bench/peers/sdpa_peer.py --manifest /tmp/crisp-cuda/manifest.json \
      --out "$out/cuda-exactness/sdpa-peer.json" --reps 2 --budget 50 2>&1 | tail -n 3
    ;;
  cuda-plan)
    # Session 6's plan checks (results/cuda-h200-session6): proxy layouts against float64
    # (small shapes, 128k) and timed (128k, 512k), fused and two-pass; conformance with the
    # defaults (the fused wg proxy pass, wgw attention, device selection); CRISP end to end on the synth layer at 128k
    # and 512k, timed and profiled, with its VS lists checked against the host selector.
    timeout -s KILL 140 $CUDA --phase proxy --proxyNs 131072 --proxyLayouts w32,wg --budget 130 \
      --out "$out/proxy-128k" > "$out/proxy-128k.log" 2>&1
    timeout -s KILL 80 $CUDA --phase proxy --proxyNs 524288 --proxyRef 0 --proxyLayouts w32,wg --budget 70 \
      --out "$out/proxy-512k" > "$out/proxy-512k.log" 2>&1
    grep -E "proxy n=|FAIL" "$out"/proxy-*.log | cut -c1-400
    # shellcheck disable=SC1091
    source apps/bench/scripts/conformance.sh
    conformance_pair "$out" conformance
    timeout -s KILL 280 $CUDA --phase bench --ns none --cross none --e2e "${E2E:-131072,524288}" --inputs synth \
      --profileToo 1 --budget 270 --out "$out/e2e" > "$out/e2e.log" 2>&1
    grep -E "^.{0,12}crisp n=" "$out/e2e.log" | cut -c1-700
    ;;
  cuda-latency)
    # Latency on the @crisp/synth llama-like scenario (host-generated, seed 7), every preset,
    # PyTorch SDPA flash/cuDNN timed in the same run; the crossover from the same rows (8k
    # and 16k are there for it).
    timeout -s KILL 345 $BENCH --backends cuda --suites latency,crossover --latency-inputs synth \
      --max-host-values 1e12 --sizes 8k,16k,32k,64k,128k,512k --deadline-s 330 \
      --out "$out/nvidia-h200-synth" 2>&1 | grep -E 'latency|crossover|skip|peer|error' | tail -n 40
    ;;
  cuda-kernels)
    # The attention layouts against v1 (self-check at 4k, then dense TFLOP/s and per-block
    # sparse cost at 64k and 128k), one process per family so a fault in one cannot take the
    # other's timings with it (results/cuda-h200-session4/kernels).
    mkdir -p "$out/kernels-mma" "$out/kernels-wgmma"
    timeout -s KILL 45 $CUDA --phase kernels --layouts w32,v1 --sweep 65536,131072 --budget 35 \
      --out "$out/kernels-mma" > "$out/kernels-mma/log.txt" 2>&1
    timeout -s KILL 55 $CUDA --phase kernels --layouts w32,wg,wgw --sweep 65536,131072 --budget 42 \
      --out "$out/kernels-wgmma" > "$out/kernels-wgmma/log.txt" 2>&1
    grep -h "layout " "$out"/kernels-*/log.txt
    ;;
  webgpu)
    # 1. The WebGPU backend's own run (tools/gpu-rig/src/webgpu-main.ts) with the default kernel
    #    ('fma', Dawn's default toggles: what a browser runs): build and
    #    float64 check, dense TFLOP/s at 8k-64k (8k timed twice), conformance at n = 65536 and
    #    4000, the sparse pipeline against its own dense at 32k-128k and the TF.js peer at 8k
    #    (results/webgpu-h200-session5; session 4's forms sweep is in results/webgpu-h200-session4).
    timeout -s KILL 300 node .device/app/webgpu-main.mjs --out "$out/webgpu-device" --budget 285 --no-wgsl \
      --probes "" --smm-probe 0 --variants fma --dense 8192,16384,32768,65536 --best-dense 8192 \
      --conformance 65536,4000 --sparse 32768,65536,131072 --tfjs 8192 2>&1 | tail -n 30
    ;;
  webgpu-latency)
    # crisp-bench's WebGPU latency (TF.js peer in the same run), merged into the folder the
    # cuda phase's suites wrote (committed to apps/bench/results/nvidia-h200 before this call).
    D="$out/nvidia-h200"
    mkdir -p "$D" && cp apps/bench/results/nvidia-h200/bench.json "$D/"
    timeout -s KILL 130 $BENCH --backends webgpu --suites latency,crossover --latency-inputs fill \
      --sizes 8k..32k --deadline-s 120 --merge --out "$D" 2>&1 | grep -E 'latency|skip|peer|error' | tail -n 20
    ;;
  *)
    echo "unknown phase $phase (cuda, cuda-latency, cuda-kernels, webgpu, webgpu-latency)" >&2
    exit 2
    ;;
esac
