#!/usr/bin/env bash
# The NVIDIA H200 runs behind the committed results, one phase per command (each fits in ten
# minutes). Packed first with tools/gpu-rig/scripts/pack.sh (see ../README.md); on the GPU
# host, from the repository root:
#   source .device/setup.sh && bash tools/gpu-rig/scripts/h200.sh PHASE OUT
# Phases:
#   conformance  the CUDA backend against the float64 reference (@crisp/conformance, n <= 16k),
#                with the chunked, LSE-merge and varlen cases, bf16 and f16: CONF_SHARDS processes
#                (default 3) per dtype side by side, each every third case (the single-threaded
#                host reference is the slow part, about 480 s a dtype in one process; the
#                cubin cache is written atomically). CONF_FILTER=REGEX runs the cases whose
#                names match. CONF_VARIANT=LAYOUT runs it with that attention layout.
#   headline     crisp-bench latency and crossover on the @crisp/synth llama-like layer, every
#                preset, PyTorch SDPA flash and cuDNN timed in the same run, 8k-512k:
#                OUT/<GPU_LABEL>-synth (apps/bench/results/nvidia-h200-synth). ~280-330 s. With
#                HEADLINE_FLEX=1 the parity suite runs on the same layer and sizes as well, so the
#                headline sets FlexPrefill's own code beside SDPA (needs its copy, as parity does;
#                up to ~570 s).
#   suites       crisp-bench accuracy, O(n) curve and floors on both GPU backends, merged into
#                OUT/nvidia-h200 (apps/bench/results/nvidia-h200), then WebGPU latency and
#                crossover with the backend's default kernel (tensor cores where offered; the
#                TF.js and ONNX Runtime Web peers in the same run) on the llama fill, 8k-32k:
#                OUT/nvidia-h200-webgpu-tc (apps/bench/results/nvidia-h200-webgpu-tc). ~370 s.
#   webgpu       the GPU rig's WebGPU main: fma and the tensor-core forms pipelined and staged,
#                and staged without its K/V staging (timing only), dense 8k-64k, the crisp
#                pipeline at 32k and 64k, conformance with each tensor-core form at the CI
#                sizes and n = 4,000: OUT/webgpu-rig (apps/bench/results/<gpu>/webgpu-rig). ~200 s.
#   webgpu-tc    the tensor-core kernel on this GPU: the GPU rig with fma and pipelined (dense 8k-64k, the
#                crisp pipeline at 32k and 64k, conformance at the CI sizes and n = 4,000), then crisp-bench
#                latency and crossover on the llama fill, 8k-64k, with the PE cut on the device (TF.js and
#                ONNX Runtime Web in the same run): OUT/webgpu-rig, OUT/nvidia-h200-webgpu-tc. ~570 s.
#   webgpu-hostcut  crisp alone, 8k-32k, with the PE cut on the host (the comparison for the device
#                cut of webgpu-tc): OUT/nvidia-h200-webgpu-tc-hostcut. ~110 s.
#   tfjs         crisp-bench's tfjs suite: @crisp/tfjs's crispAttention on tfjs-backend-webgpu (Dawn over
#                Vulkan) against TF.js's own dense attention on the same tensors, f32, 8k-32k, and
#                the host path beside the zero-copy path at 16k: OUT/nvidia-h200-tfjs
#                (apps/bench/results/nvidia-h200-tfjs). ~120-200 s.
#   varlen       crisp-bench's varlen suite on CUDA: a ragged batch of 8 @crisp/synth llama-like
#                sequences (lengths 4k-128k, seed 7) through varlenPrefill against one sparsePrefill
#                per sequence, CRISP's dense kernel and PyTorch SDPA flash and cuDNN per sequence,
#                then one 128k sequence prefilled in 4 chunks against one full prefill:
#                OUT/nvidia-h200-varlen (apps/bench/results/nvidia-h200-varlen).
#   parity       crisp-bench's parity suite on CUDA: the flexPrefill preset against FlexPrefill's own
#                flex_prefill_attention on the same @crisp/synth layers (llama-like, diffuse,
#                mixed-threshold, vs-trap; 16k and 128k; seeds 1 and 2; the Llama shape 32,8,128;
#                sizes the deadline does not reach are reported as skipped): routes, block sets, errors
#                against float64 dense rows, densities and times, with crisp and crispGuarded timed
#                and scored on the same layers beside FlexPrefill's code: OUT/nvidia-h200-parity
#                (apps/bench/results/nvidia-h200-parity). Needs PyTorch, Triton, safetensors and a
#                copy of FlexPrefill's flex_prefill package at apps/bench/peers/.flexprefill
#                (apps/bench/peers/README.md); without them the run records the peer as absent.
#                crispGuarded's plan is made on the device (the backend's default) unless GUARD_PLAN=host.
#                PARITY_SIZES, PARITY_PROFILES, PARITY_SEEDS and PARITY_DEADLINE_S override the defaults;
#                PARITY_NAME (default parity) names the folder: OUT/nvidia-h200-PARITY_NAME. The headline's
#                layer at its long sizes: PARITY_SIZES=128k,512k PARITY_PROFILES=llama-like PARITY_SEEDS=7
#                PARITY_NAME=parity-headline.
#   guard        the conformance cases devicePlanNarrowed, devicePlanGuarded and the crispGuarded
#                pipelines (crispGuarded's narrowed PE lists on the device), then crisp-bench's accuracy suite on CUDA over
#                the six @crisp/synth profiles (the routing-failure ones too) at 16k and 64k, every
#                sparse preset (worst head, proxy recall, needles, density), then the latency of
#                crisp, crispGuarded and flexPrefill at 128k and 512k on the llama fill (the
#                guarded preset's plan share; no SDPA peer), crispGuarded planned on the device
#                if the cases passed, else on the host (and the phase fails):
#                OUT/nvidia-h200-guard (apps/bench/results/nvidia-h200-guard). ~500 s.
#   flexplan     flexPrefill's plan on the device (the CUDA backend's flexPrefillOnDevice): the
#                conformance cases devicePlanCoverage and the flexPrefill pipeline cases in both
#                dtypes, then, if they all passed, the latency of crisp and flexPrefill at 128k and
#                512k on the llama fill with --cuda-flex-plan device: OUT/conformance,
#                OUT/nvidia-h200-flexplan. Bounded at 500 s + 200 s (the filtered conformance is
#                a few dozen cases).
#   kernels      the attention layouts wgw and wgt (and wg3 at d 64), each checked against w32 at 4k, then timed dense and
#                on a regular sparse pattern at 16k-512k (d 128) and 16k-64k (d 64), and PyTorch SDPA flash
#                and cuDNN at d 64 / 64k and d 128 / 512k (apps/bench/peers/sdpa_time.py): OUT/kernels-d128,
#                OUT/kernels-d64, OUT/sdpa-*.json (apps/bench/results/<gpu>/kernels). ~250 s.
#   dense-short  the dense kernel (d 128, bf16) against PyTorch SDPA cuDNN at 16k and 32k, where cuDNN
#                leads: SHORT_ROUNDS (default 3) rounds, each the GPU rig's kernels phase for `wgt` and
#                then sdpa_time.py's cuDNN, 40 timed launches a size, the SM clock and power sampled
#                every 50 ms throughout (OUT/clocks.csv, OUT/rounds.txt); crisp-bench's dense preset
#                on the synth layer beside its SDPA cuDNN peer (which makes its own inputs from the
#                fill's hash formula), as the headline compares them (OUT/synth, when crisp-bench is
#                bundled); then
#                Nsight Compute's full set on one timed launch of each kernel at 16k and at 32k
#                (clock control off): OUT/ncu-*-details.csv and -raw.csv. ~200-300 s.
#   nccl         context-parallel crisp over NCCL on this host's GPUs (pack tools/gpu-rig/src/nccl-main.ts
#                and tools/gpu-rig/src/nccl-table.ts), the Llama shape, NCCL_RANKS (default 1 2 4 8, up to
#                the GPUs) x NCCL_SIZES (default 524288): per rank its prefill times and bytes, rank 0's
#                check against one backend up to 1M: OUT/nccl-p<P>-n<N>.log, then the scaling table
#                OUT/nccl.md and OUT/nccl.json. Each run is bounded by NCCL_TIMEOUT_S (280).
#   parallel     crisp-bench's parallel suite on CUDA: the crisp plan of the @crisp/synth llama-like layer
#                at 512k and 1M tokens (the CUDA backend's maxSequence; one GPU makes the plan, which every rank of a context-parallel
#                run makes too), and for 2, 4 and 8 ranks the K/V bytes each rank receives against a dense
#                ring, the plan's bytes and the load balance: OUT/nvidia-h200-parallel
#                (apps/bench/results/nvidia-h200-parallel). Time and scaling need several GPUs.
#   million      one sequence of 1,048,576 tokens (q holds 2^32 elements: every offset 64-bit): the
#                crisp preset's sparsePrefill on the llama fill against the dense kernel's output,
#                then (when the CLI bundle is there) a 12 GB safetensors dump of the same layer
#                written by @crisp/io and run by `crisp run --qkv` with its wall time: OUT/million/cuda-bench.json,
#                OUT/million.log, OUT/crisp-run-1m.log. ~250-400 s.
#   hostile      the hostile-input soak on the CUDA backend: 1,000 calls (seed 37), valid ones checked
#                against float64 rows and invalid ones against their CrispError codes, injected and
#                real faults (allocation, launch, a full device, NaN), device memory before and
#                after, then a kernel fault in a child process (DEVICE_LOST, a new backend after
#                it): OUT/hostile.json, OUT/hostile.log, OUT/sticky.log. ~60-150 s (NVRTC compiles
#                at first use).
# GPU_LABEL (default nvidia-h200) names the result folders of the headline, WebGPU latency and parity phases when
# another GPU runs them.
# Set CRISP_GIT_COMMIT to the commit being run: crisp-bench labels its results with it (the
# copy on the GPU host may have no git metadata). Copy OUT's nvidia-h200* folders over
# apps/bench/results/ unedited. Every step writes its results as it goes, and each runs under
# a hard limit, so a step cut short leaves what it finished.
set -u
phase=${1:?usage: h200.sh conformance|headline|suites|webgpu|webgpu-tc|webgpu-hostcut|tfjs|varlen|parity|guard|flexplan|kernels|dense-short|parallel|million|hostile OUT}
out=$(realpath -m "${2:?usage: h200.sh conformance|headline|suites|webgpu|webgpu-tc|webgpu-hostcut|tfjs|varlen|parity|guard|flexplan|kernels|dense-short|parallel|million|hostile OUT}")
mkdir -p "$out"
command -v node >/dev/null || { echo "no node on PATH: source .device/setup.sh first" >&2; exit 2; }
[ -n "${CRISP_GIT_COMMIT:-}" ] || echo "note: CRISP_GIT_COMMIT is not set; crisp-bench reads the commit from git" >&2
app=.device/app
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 || true

case "$phase" in
  conformance)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    # CONF_SHARDS processes per dtype (default 3), each every third case: the float64
    # reference that checks them is single-threaded, and one process per dtype ran past 500 s
    shards=${CONF_SHARDS:-3}
    conf() { # DTYPE SHARD
      timeout -s KILL 500 node "$app/cuda-main.mjs" --phase conformance --dtypes "$1" --confMaxN 16384 --budget 470 \
        --confShard "$2/$shards" ${CONF_FILTER:+--confFilter "$CONF_FILTER"} ${CONF_VARIANT:+--variant "$CONF_VARIANT"} \
        --out "$out/conformance-$1-$2" > "$out/conformance-$1-$2.log" 2>&1
    }
    conf bf16 0 &
    pids=$!
    # the others start once the first has compiled the kernels into the cubin cache
    sleep 10
    for dt in bf16 f16; do
      for ((i = 0; i < shards; i++)); do
        [ "$dt/$i" = bf16/0 ] && continue
        conf "$dt" "$i" &
        pids="$pids $!"
      done
    done
    wait $pids
    grep -h "conformance cuda:" "$out"/conformance-*.log
    grep -h FAIL "$out"/conformance-*.log | head -n 20
    # every summary there and no failure
    [ "$(cat "$out"/conformance-*.log | grep -c 'conformance cuda:')" -eq $((2 * shards)) ] && ! grep -q FAIL "$out"/conformance-*.log
    ;;
  headline)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    # HEADLINE_FLEX=1: FlexPrefill's own code on the same layer too (the parity suite at the
    # headline's sizes, crisp beside it), which headline.md then sets beside SDPA
    suites=latency,crossover; dl=315; flex=()
    if [ "${HEADLINE_FLEX:-0}" = 1 ]; then
      suites=latency,crossover,parity; dl=540
      flex=(--parity-sizes 8k,16k,32k,64k,128k,512k --parity-profiles llama-like --parity-seeds 7 --parity-shape 32,8,128 --parity-presets crisp)
    fi
    timeout -s KILL $((dl + 30)) node "$app/crisp-bench.mjs" --backends cuda --suites "$suites" --latency-inputs synth \
      --max-host-values 1e12 --sizes 8k,16k,32k,64k,128k,512k --deadline-s "$dl" ${flex[@]+"${flex[@]}"} \
      --out "$out/${GPU_LABEL:-nvidia-h200}-synth" > "$out/headline.log" 2>&1
    rc=$?
    grep -E 'latency|crossover|skip|peer|error' "$out/headline.log" | tail -n 40
    exit $rc
    ;;
  suites)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    d=$out/nvidia-h200
    # accuracy at 8k and 16k, the O(n) curve's proxy statistics 4k-128k, floors at 8k
    timeout -s KILL 200 node "$app/crisp-bench.mjs" --backends cuda,webgpu --suites accuracy,onCurve,floors \
      --acc-sizes 8k,16k --acc-flex-gammas none --proxy-sizes 4k..128k --floors-n 8k --deadline-s 190 --merge --out "$d" \
      > "$out/suites.log" 2>&1
    rc=$?
    tail -n 3 "$out/suites.log"
    timeout -s KILL 175 node "$app/crisp-bench.mjs" --backends webgpu --suites latency,crossover --latency-inputs fill \
      --sizes 8k..32k --deadline-s 165 --out "$out/${GPU_LABEL:-nvidia-h200}-webgpu-tc" > "$out/webgpu-latency.log" 2>&1
    rc2=$?
    grep -E 'latency|skip|peer|error' "$out/webgpu-latency.log" | tail -n 20
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
    ;;
  webgpu)
    timeout -s KILL 285 node "$app/webgpu-main.mjs" --out "$out/webgpu-rig" --no-wgsl --budget 265 \
      --variants fma,subgroup-matrix:staged,subgroup-matrix:pipelined,subgroup-matrix:staged~stage \
      --dense 8192,16384,32768,65536 --sparse 32768,65536 --tfjs '' --smm-probe 0 --probes '' --conformance 0,4000 \
      > "$out/webgpu-rig.out" 2>&1
    rc=$?
    grep -E 'best|conformance [0-9]|FATAL' "$out/webgpu-rig/webgpu-device.log" | tail -n 8
    exit $rc
    ;;
  webgpu-tc)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    timeout -s KILL 215 node "$app/webgpu-main.mjs" --out "$out/webgpu-rig" --no-wgsl --budget 195 \
      --variants fma,subgroup-matrix:pipelined --dense 8192,16384,32768,65536 --sparse 32768,65536 --tfjs '' \
      --smm-probe 0 --probes '' --conformance 0,4000 > "$out/webgpu-rig.out" 2>&1
    rc=$?
    grep -E 'best|conformance [0-9]|FATAL' "$out/webgpu-rig/webgpu-device.log" | tail -n 8
    timeout -s KILL 355 node "$app/crisp-bench.mjs" --backends webgpu --suites latency,crossover --latency-inputs fill \
      --sizes 8k..64k --budget-s 150 --kernel-times --deadline-s 345 --out "$out/${GPU_LABEL:-nvidia-h200}-webgpu-tc" > "$out/webgpu-latency.log" 2>&1
    rc2=$?
    grep -E 'latency|skip|peer|error' "$out/webgpu-latency.log" | tail -n 20
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
    ;;
  webgpu-hostcut)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    timeout -s KILL 115 node "$app/crisp-bench.mjs" --backends webgpu --suites latency --latency-inputs fill \
      --sizes 8k..32k --presets crisp --webgpu-pe-cut host --jit-warmup 500 --kernel-times --deadline-s 105 \
      --out "$out/${GPU_LABEL:-nvidia-h200}-webgpu-tc-hostcut" > "$out/webgpu-hostcut.log" 2>&1
    rc=$?
    grep -E 'latency|skip|error' "$out/webgpu-hostcut.log" | tail -n 10
    exit $rc
    ;;
  tfjs)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    timeout -s KILL 300 node "$app/crisp-bench.mjs" --backends webgpu --suites tfjs --tfjs-sizes 8k,16k,32k --deadline-s 280 \
      --out "$out/nvidia-h200-tfjs" > "$out/tfjs.log" 2>&1
    rc=$?
    grep -E 'tfjs|skip|error' "$out/tfjs.log" | tail -n 20
    exit $rc
    ;;
  varlen)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    timeout -s KILL 295 node "$app/crisp-bench.mjs" --backends cuda --suites varlen --varlen-batch 8 --varlen-seed 7 \
      --varlen-range 4k..128k --chunked-n 128k --chunks 4 --deadline-s 275 \
      --out "$out/nvidia-h200-varlen" > "$out/varlen.log" 2>&1
    rc=$?
    grep -E 'varlen|skip|peer|error' "$out/varlen.log" | tail -n 30
    exit $rc
    ;;
  parity)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    fp=apps/bench/peers/.flexprefill/flex_prefill/ops/flex_prefill_attention.py
    [ -f "$fp" ] || echo "note: no $fp: the parity suite will record the FlexPrefill peer as absent" >&2
    dl=${PARITY_DEADLINE_S:-540}
    timeout -s KILL $((dl + 20)) node "$app/crisp-bench.mjs" --backends cuda --suites parity --parity-sizes "${PARITY_SIZES:-16k,128k}" \
      --parity-profiles "${PARITY_PROFILES:-llama-like,diffuse,mixed-threshold,vs-trap}" --parity-seeds "${PARITY_SEEDS:-1,2}" --parity-shape 32,8,128 \
      --deadline-s "$dl" --cuda-guard-plan "${GUARD_PLAN:-device}" --out "$out/${GPU_LABEL:-nvidia-h200}-${PARITY_NAME:-parity}" > "$out/parity.log" 2>&1
    rc=$?
    grep -E 'parity|flexprefill|skip|error' "$out/parity.log" | tail -n 40
    exit $rc
    ;;
  guard)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    # exactness first: crispGuarded's narrowed PE lists on the device against the host parts
    # (the rig's backend has peVsExcessOnDevice on); its plan goes on the device only if they pass
    where=host
    CONF_FILTER='^(devicePlan(Narrowed|Guarded)/|pipeline/crispGuarded|varlen/pipeline/crispGuarded)' bash "$0" conformance "$out/conformance-guard" && where=device
    echo "guard: crispGuarded planned on the $where"
    # (no FlexPrefill γ sweep here: the masks are the host rules', which the CPU results sweep)
    timeout -s KILL 260 node "$app/crisp-bench.mjs" --backends cuda --suites accuracy --acc-sizes 16k,64k --deadline-s 250 \
      --acc-flex-gammas none --cuda-guard-plan "$where" --out "$out/nvidia-h200-guard" > "$out/guard-accuracy.log" 2>&1
    rc=$?
    grep -E 'accuracy' "$out/guard-accuracy.log" | tail -n 16
    timeout -s KILL 150 node "$app/crisp-bench.mjs" --backends cuda --suites latency --latency-inputs fill --sizes 128k,512k \
      --presets crisp,crispGuarded,flexPrefill --cuda-guard-plan "$where" --jit-warmup 200 --peer-script /nonexistent-peer.py \
      --deadline-s 140 --merge --out "$out/nvidia-h200-guard" > "$out/guard-latency.log" 2>&1
    rc2=$?
    grep -E 'latency|plan' "$out/guard-latency.log" | tail -n 12
    [ "$where" = device ] && [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
    ;;
  flexplan)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    # exactness first: the device plan of FlexPrefill's rules against the host parts, and the
    # flexPrefill pipeline cases (the rig's backend has flexPrefillOnDevice on), both dtypes
    CONF_FILTER='^(devicePlanCoverage|pipeline/flexPrefill|varlen/pipeline/flexPrefill)' bash "$0" conformance "$out/conformance"
    rc=$?
    # then the timing, only if every case passed: flexPrefill with its plan on the device
    rc2=1
    if [ $rc -eq 0 ]; then
      timeout -s KILL 200 node "$app/crisp-bench.mjs" --backends cuda --suites latency --latency-inputs fill --sizes 128k,512k \
        --presets crisp,flexPrefill --cuda-flex-plan device --jit-warmup 200 --peer-script /nonexistent-peer.py --deadline-s 190 \
        --out "$out/nvidia-h200-flexplan" > "$out/flexplan-latency.log" 2>&1
      rc2=$?
      grep -E 'latency|plan' "$out/flexplan-latency.log" | tail -n 12
    fi
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
    ;;
  kernels)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    timeout -s KILL 130 node "$app/cuda-main.mjs" --phase kernels --layouts wgw,wgt --sweep 16384,65536,131072,524288 \
      --budget 120 --out "$out/kernels-d128" > "$out/kernels-d128.log" 2>&1
    rc=$?
    timeout -s KILL 60 node "$app/cuda-main.mjs" --phase kernels --headDim 64 --layouts wgw,wgt,wg3 --sweep 16384,65536 \
      --budget 50 --out "$out/kernels-d64" > "$out/kernels-d64.log" 2>&1 || rc=1
    for spec in "65536 64" "524288 128"; do
      set -- $spec
      timeout -s KILL 90 python3 apps/bench/peers/sdpa_time.py --n "$1" --head-dim "$2" --reps 3 \
        > "$out/sdpa-n$1-d$2.json" 2> "$out/sdpa-n$1-d$2.err" || rc=1
    done
    grep -h "layout" "$out"/kernels-d*.log
    cat "$out"/sdpa-*.json
    exit $rc
    ;;
  dense-short)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    command -v ncu >/dev/null || PATH=/usr/local/cuda/bin:$PATH
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 50 > "$out/clocks.csv" 2>&1 &
    smi=$!
    rc=0
    for ((r = 1; r <= ${SHORT_ROUNDS:-3}; r++)); do
      echo "round $r: wgt $(date +%T.%N)" >> "$out/rounds.txt"
      timeout -s KILL 90 node "$app/cuda-main.mjs" --phase kernels --layouts wgt --sweep 16384,32768 --reps 40 --check none \
        --budget 80 --out "$out/wgt-r$r" > "$out/wgt-r$r.log" 2>&1 || rc=1
      for n in 16384 32768; do
        echo "round $r: cudnn n=$n $(date +%T.%N)" >> "$out/rounds.txt"
        timeout -s KILL 90 python3 apps/bench/peers/sdpa_time.py --n $n --reps 40 --backends cudnn \
          > "$out/cudnn-n$n-r$r.json" 2> "$out/cudnn-n$n-r$r.err" || rc=1
      done
    done
    # the headline's own comparison: the dense preset on the synth layer, crisp-bench's SDPA
    # cuDNN peer on its hash-formula inputs of the same shape
    if [ -f "$app/crisp-bench.mjs" ]; then
      timeout -s KILL 170 node "$app/crisp-bench.mjs" --backends cuda --suites latency --latency-inputs synth \
        --max-host-values 1e12 --sizes 16k,32k --presets dense --peers torch-sdpa-cudnn --reps 10 --deadline-s 160 \
        --out "$out/synth" > "$out/synth.log" 2>&1 || rc=1
    fi
    kill $smi 2>/dev/null
    # one timed launch of each under Nsight Compute per size: `wgt`'s second dense launch (the
    # first is timeIt's warm-up; the sparse pattern's come after), cuDNN's inside its NVTX range
    for n in 16384 32768; do
      k=$((n / 1024))k
      timeout -s KILL 150 ncu --clock-control none --target-processes all --kernel-name regex:attn_wgt_bf16_d128 \
        --launch-skip 1 --launch-count 1 --set full -o "$out/ncu-wgt-$k" \
        node "$app/cuda-main.mjs" --phase kernels --layouts wgt --sweep $n --reps 1 --check none --budget 100 \
        --out "$out/ncu-wgt-run-$k" > "$out/ncu-wgt-$k.log" 2>&1 || rc=1
      timeout -s KILL 150 ncu --clock-control none --nvtx --nvtx-include "sdpa-cudnn/" --launch-count 1 --set full \
        -o "$out/ncu-cudnn-$k" python3 apps/bench/peers/sdpa_time.py --n $n --reps 1 --backends cudnn \
        > "$out/ncu-cudnn-$k.log" 2>&1 || rc=1
      for f in wgt cudnn; do
        [ -f "$out/ncu-$f-$k.ncu-rep" ] || continue
        ncu --import "$out/ncu-$f-$k.ncu-rep" --page details --csv > "$out/ncu-$f-$k-details.csv"
        ncu --import "$out/ncu-$f-$k.ncu-rep" --page raw --csv > "$out/ncu-$f-$k-raw.csv"
      done
    done
    grep -h "layout" "$out"/wgt-r*.log
    cat "$out"/cudnn-n*.json
    [ -f "$out/synth.log" ] && grep -E 'latency|peer|error' "$out/synth.log" | tail -n 8
    for f in "$out"/ncu-*-details.csv; do
      [ -f "$f" ] && python3 -c 'import csv,sys
keep = {"Duration", "SM Frequency", "Grid Size", "Block Size", "Registers Per Thread", "Dynamic Shared Memory Per Block",
        "Waves Per SM", "Issue Slots Busy", "Compute (SM) Throughput", "Achieved Occupancy"}
for r in csv.DictReader(open(sys.argv[1])):
    if r.get("Metric Name") in keep: print(r["Kernel Name"][:60], "|", r["Metric Name"], r["Metric Value"], r["Metric Unit"])' "$f"
    done
    exit $rc
    ;;
  nccl)
    for e in nccl-main nccl-table; do
      [ -f "$app/$e.mjs" ] || { echo "missing $app/$e.mjs: pack tools/gpu-rig/src/nccl-main.ts tools/gpu-rig/src/nccl-table.ts" >&2; exit 2; }
    done
    # context-parallel crisp over NCCL across this host's GPUs, the Llama shape (32, 8, 128, bf16),
    # for each rank count in NCCL_RANKS (default 1 2 4 8, those the GPUs allow) and length in
    # NCCL_SIZES (default 524288): rank 0 checks the output and plan against one backend's up to
    # 1M positions; two timed prefills after the first. NCCL from PyTorch's wheel where the
    # loader has none (CRISP_NCCL_LIBRARY overrides).
    gpus=$(nvidia-smi -L | wc -l)
    if [ -z "${CRISP_NCCL_LIBRARY:-}" ]; then
      lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)
      [ -n "$lib" ] && [ -f "$lib" ] && export CRISP_NCCL_LIBRARY=$lib
    fi
    rc=0
    for n in ${NCCL_SIZES:-524288}; do
      for P in ${NCCL_RANKS:-1 2 4 8}; do
        [ "$P" -le "$gpus" ] || continue
        chk=on; [ "$n" -gt 1048576 ] && chk=off
        timeout -s KILL "${NCCL_TIMEOUT_S:-280}" node "$app/nccl-main.mjs" --ranks "$P" --devices "$gpus" --n "$n" --heads 32 \
          --kv-heads 8 --reps 2 --check "$chk" --init-timeout-ms 60000 > "$out/nccl-p$P-n$n.log" 2>&1 || rc=1
        tail -n 3 "$out/nccl-p$P-n$n.log" | cut -c1-400
      done
    done
    # the scaling table (time, efficiency against one rank, bytes against a dense ring): OUT/nccl.json, OUT/nccl.md
    node "$app/nccl-table.mjs" "$out" || rc=1
    exit $rc
    ;;
  parallel)
    [ -f "$app/crisp-bench.mjs" ] || { echo "missing $app/crisp-bench.mjs: bundle apps/bench/src/cli.ts" >&2; exit 2; }
    timeout -s KILL 300 node "$app/crisp-bench.mjs" --backends cuda --suites parallel --parallel-sizes 512k,1024k \
      --parallel-ranks 2,4,8 --deadline-s 280 --out "$out/nvidia-h200-parallel" > "$out/parallel.log" 2>&1
    rc=$?
    grep -E 'parallel|skip|error' "$out/parallel.log" | tail -n 30
    exit $rc
    ;;
  million)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    timeout -s KILL 300 node "$app/cuda-main.mjs" --phase bench --ns none --cross none --e2e 1048576 --budget 280 \
      --out "$out/million" > "$out/million.log" 2>&1
    rc=$?
    grep -E 'crisp n=|error|Error' "$out/million.log" | tail -n 10
    [ -f "$app/crisp.mjs" ] || { echo "no $app/crisp.mjs (bundle apps/cli/bin/crisp.js): crisp run --qkv not run"; exit $rc; }
    # the same layer as a 12 GB dump written from the device by @crisp/io, then read and run by the CLI
    dump=/tmp/crisp-dump-1m.safetensors
    timeout -s KILL 150 node "$app/cuda-main.mjs" --phase dump --dumpN 1048576 --dumpPath "$dump" --budget 140 \
      --out "$out/dump" > "$out/dump.log" 2>&1 || rc=1
    grep -E 'dump n=|ERROR' "$out/dump.log"
    start=$(date +%s.%N)
    timeout -s KILL 420 node "$app/crisp.mjs" run --qkv "$dump" --backend cuda --repeats 1 > "$out/crisp-run-1m.log" 2>&1 || rc=1
    end=$(date +%s.%N)
    awk "BEGIN { printf \"wall %.1f s\\n\", $end - $start }" >> "$out/crisp-run-1m.log"
    tail -n 8 "$out/crisp-run-1m.log"
    rm -f "$dump"
    exit $rc
    ;;
  hostile)
    [ -f "$app/cuda-main.mjs" ] || { echo "missing $app/cuda-main.mjs: pack tools/gpu-rig/src/cuda-main.ts" >&2; exit 2; }
    timeout -s KILL 200 node "$app/cuda-main.mjs" --phase hostile --calls 1000 --seed 37 --strictPolicy on --budget 180 \
      --out "$out" > "$out/hostile.log" 2>&1
    rc=$?
    grep -E 'hostile:|fault case|soak:|sticky:|FAIL|ERROR' "$out/hostile.log" | tail -n 60
    [ $rc -eq 0 ] && grep -q 'hostile: PASSED' "$out/hostile.log"
    ;;
  *)
    echo "unknown phase $phase (conformance, headline, suites, webgpu, webgpu-tc, webgpu-hostcut, tfjs, varlen, parity, guard, flexplan, kernels, parallel, million, hostile)" >&2
    exit 2
    ;;
esac
