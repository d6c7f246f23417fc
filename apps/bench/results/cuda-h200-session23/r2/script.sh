#!/usr/bin/env bash
# session 23 r2: the README's CUDA headline regenerated with main's code (its documented command)
set -u
dest=$(realpath -m "${1:?out}")
mkdir -p "$dest"
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$dest/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$dest/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' | tee "$dest/torch.txt"
timeout -s KILL 540 node .device/app/crisp-bench.mjs --backends cuda --suites latency,crossover --latency-inputs synth \
  --max-host-values 1e12 --sizes 8k,16k,32k,64k,128k,512k --deadline-s 315 --out "$dest/hl" 2>&1 | tee "$dest/hl.log"
echo "rc ${PIPESTATUS[0]}"
