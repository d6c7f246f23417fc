#!/usr/bin/env bash
# session 24 r3: conformance of main against float64 (n <= 16k), bf16 and f16 side by side, with the time r5 of session 23 lacked
set -u
dest=$(realpath -m "${1:?out}")
mkdir -p "$dest" /tmp/r3
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r3.tgz" -C /tmp r3' EXIT
source .device/setup.sh
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader | tee /tmp/r3/machine.txt
timeout -s KILL 360 node .device/app/cuda-device-main.mjs --phase conformance --dtypes bf16 --confMaxN 16384 \
  --budget 350 --out /tmp/r3/conf-bf16 > /tmp/r3/conf-bf16.log 2>&1 &
pid=$!
sleep 10
timeout -s KILL 360 node .device/app/cuda-device-main.mjs --phase conformance --dtypes f16 --confMaxN 16384 \
  --budget 340 --out /tmp/r3/conf-f16 > /tmp/r3/conf-f16.log 2>&1
echo "f16 rc $?"
wait "$pid"
echo "bf16 rc $?"
grep -h "conformance cuda:" /tmp/r3/conf-*.log
grep -h FAIL /tmp/r3/conf-*.log | head -n 10
echo "done [$(($(date +%s) - T0)) s]"
