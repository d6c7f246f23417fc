#!/usr/bin/env bash
# session 21, call 4: `crisp run` (the README's main job) from the CLI bundled at 0a9573f, run
# from /tmp with no kernels/ folder anywhere near the bundle (the sources are embedded now)
set -u
dest=$(realpath -m "${1:?out}")
root=$(pwd)
mkdir -p "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
source .device/setup.sh
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
ls "$root/.device"
cd /tmp && timeout -s KILL 200 node "$root/.device/app/crisp.mjs" run > "$dest/crisp-run.log" 2>&1
echo "crisp run rc $?"; head -n 3 "$dest/crisp-run.log"; tail -n 4 "$dest/crisp-run.log"
