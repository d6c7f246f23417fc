#!/usr/bin/env bash
# session 23 r5: conformance (bf16 and f16 side by side, n <= 16k) of main's host code after the
# path-to-launch change, within the session's last device time (each process stops starting
# cases after --budget seconds)
set -u
dest=$(realpath -m "${1:?out}")
mkdir -p "$dest"
source .device/setup.sh
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$dest/machine.txt"
timeout -s KILL 175 node .device/app/cuda-device-main.mjs --phase conformance --dtypes bf16 --confMaxN 16384 --budget 150 --out "$dest/conf-bf16" > "$dest/conf-bf16.log" 2>&1 &
pid=$!
sleep 5
timeout -s KILL 170 node .device/app/cuda-device-main.mjs --phase conformance --dtypes f16 --confMaxN 16384 --budget 145 --out "$dest/conf-f16" > "$dest/conf-f16.log" 2>&1
wait "$pid"
grep -h "conformance cuda:" "$dest"/conf-*.log
grep -h FAIL "$dest"/conf-*.log | head -n 10
tail -n 3 "$dest"/conf-*.log
