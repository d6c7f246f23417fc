#!/usr/bin/env bash
# session 20, call 3: 7c2feea's host code against 76a086a's (HEAD) in one process, prefills
# alternated from an idle device (host-ab-gpu.mjs), both slot orders, and an A/A control.
set -u
dest=$(realpath -m "$1"); out=/tmp/r3; rm -rf $out; mkdir -p $out $dest
exec > >(tee "$dest/summary.txt") 2>&1
trap 'tar czf "$dest/r3.tgz" -C /tmp r3' EXIT
source .device/setup.sh
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
nvidia-smi --query-gpu=serial,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader > "$out/machine.txt"; cat $out/machine.txt
app=.device/app
for x in old:new new:old new:new2 old:new new:old; do
  [ $(( $(date +%s) - T0 )) -gt 400 ] && { echo "out of time before $x"; break; }
  IFS=: read -r a b <<< "$x"; [ "$b" = new2 ] && { cp $app/ab-new.mjs $app/ab-new2.mjs; }
  echo "== A=$a B=$b"
  timeout -s KILL 150 node $app/host-ab-gpu.mjs $app/ab-$a.mjs $app/ab-$b.mjs 131072 200 > $out/ab-$a-$b-$(date +%s).log 2>&1; echo "rc $? [$(( $(date +%s) - T0 )) s]"
  tail -4 $(ls -t $out/ab-$a-$b-*.log | head -1)
done
echo "done [$(( $(date +%s) - T0 )) s]"
