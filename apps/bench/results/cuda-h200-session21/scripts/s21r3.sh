#!/usr/bin/env bash
# session 21, call 3: host memory over 400 awaited 128k prefills in one job, before (4ac4bd9) and
# after (a1d2f4c) the statistics-lifetime fix (6fd6484), then `crisp run` (the README's main job)
set -u
dest=$(realpath -m "${1:?out}")
out=/tmp/s21r3
rm -rf "$out" && mkdir -p "$out" "$dest"
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/s21r3.tgz" -C /tmp s21r3' EXIT
source .device/setup.sh
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
for b in a1d2f4c 4ac4bd9 a1d2f4c; do
  timeout -s KILL 150 node --expose-gc .device/app/lifetime-gpu.mjs .device/app/ab-$b.mjs 131072 400 > "$out/lifetime-$b.log" 2>&1
  echo "lifetime $b rc $? [$(since) s]"; cat "$out/lifetime-$b.log" | tail -n 12
done
timeout -s KILL 150 node .device/app/crisp.mjs run > "$out/crisp-run.log" 2>&1
echo "crisp run rc $? [$(since) s]"; tail -n 30 "$out/crisp-run.log"
echo "done [$(since) s]"
