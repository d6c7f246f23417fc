#!/usr/bin/env bash
# One device call that shows where a kernel's instructions go (session 11): the SASS of
# kernels/<file> for sm_90a (nvcc + cuobjdump on the GPU machine; the CPU machines have no
# disassembler), and Nsight Compute's per-instruction counts for one launch of the kernel
# (the proxy phase at 128k, the wg layout). Packing as in h200.sh.
# Usage: bash apps/bench/scripts/h200-profile.sh OUT [kernel regex] [.cu file]
set -u
out=${1:?output folder}
kern=${2:-proxy_wg_pass1f_bf16_d128_b128}
file=${3:-proxy-wgmma.cu}
mkdir -p "$out"
# shellcheck disable=SC1091
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
CU=/usr/local/cuda/bin
(cd packages/kernels-cuda/kernels && "$CU/nvcc" -arch=sm_90a -cubin -use_fast_math -std=c++17 -Xptxas -v \
  -o "$out/k.cubin" "$file") > "$out/ptxas.txt" 2>&1
"$CU/cuobjdump" -sass -fun "$kern" "$out/k.cubin" > "$out/sass.txt" 2>&1 || "$CU/cuobjdump" -sass "$out/k.cubin" > "$out/sass.txt" 2>&1
rm -f "$out/k.cubin"
wc -l "$out/sass.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
if [ -n "$NCU" ]; then
  timeout -s KILL 150 "$NCU" --kernel-name "regex:$kern" --launch-count 1 --set full --import-source no -o "$out/prof" \
    node .device/app/cuda-main.mjs --phase proxy --proxySmall 0 --proxyNs 131072 --proxyRef 0 --proxyLayouts wg --budget 100 \
    > "$out/ncu-run.log" 2>&1
  tail -n 3 "$out/ncu-run.log"
  "$NCU" -i "$out/prof.ncu-rep" --page source --print-source sass --csv > "$out/source-sass.csv" 2> "$out/source-err.txt"
  "$NCU" -i "$out/prof.ncu-rep" --page details > "$out/details.txt" 2>&1
  wc -l "$out/source-sass.csv" "$out/details.txt"
  head -c 600 "$out/source-err.txt"
  gzip -f "$out/prof.ncu-rep"
fi
