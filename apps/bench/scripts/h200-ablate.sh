#!/usr/bin/env bash
# Where the fused proxy pass's time goes, by leaving one piece out at a time (METHOD.md: time
# variants and take differences; the outputs of a variant are wrong by design, only its time
# counts). Each variant is a patched copy of the kernels under .device/abl/NAME, run with this
# tree's bundle from that folder (the backend reads packages/kernels-cuda/kernels from the cwd).
# Usage: bash apps/bench/scripts/h200-ablate.sh OUT [N] [VARIANTS...]  (after .device/setup.sh)
set -u
out=${1:?output folder}; n=${2:-131072}; shift 2 || shift $#
mkdir -p "$out"
root=$PWD
# name -> perl substitution on proxy-wgmma.cu (W) or proxy-common.cuh (C)
declare -A W C
W[nokmean]='s/const bool doMeans = PASS1 && h % \(H \/ Hkv\) == part % \(H \/ Hkv\);/const bool doMeans = false;/'
C[noentropy]='s/^\s*tt[AB] = fmaf\(p[ab], EDGE.*\n//mg'
W[nostash]='s/if \(FUSED\) p1f_stash<BM>\(tup, tt, rA, rB, mA, mB, split, win\);//'
C[nosplit]='s/const bool noSplit = LGB > 0 && !EDGE && __all_sync\(0xffffffffu, cutA >= 57 && cutB >= 57\);/const bool noSplit = LGB > 0 && !EDGE;/'
W[noload]='s/if \(tt \+ ST - 1 < nT\) loadK\(tt \+ ST - 1\);//'
W[nobarrier]='s/fence_proxy_async\(\);\n    __syncthreads\(\);/fence_proxy_async();/'
W[nomma]='s/proxy_issue_s<D, 64, BM, BF16>\(s, qBase, kBase\);//'
C[nosoftmax]='s/(bool win = false\) \{\n  const int lane = threadIdx.x & 31;)/$1\n  if (!EDGE) return;/'
variants=("$@"); [ ${#variants[@]} -eq 0 ] && variants=(base nokmean noentropy nostash nosplit noload nobarrier nomma nosoftmax)
for v in "${variants[@]}"; do
  d=.device/abl/$v
  rm -rf "$d"; mkdir -p "$d/packages/kernels-cuda"
  cp -r packages/kernels-cuda/kernels "$d/packages/kernels-cuda/"
  for part in ${v//+/ }; do
    [ "$part" = base ] && continue
    if [ -n "${W[$part]:-}" ]; then f=proxy-wgmma.cu; e=${W[$part]}; else f=proxy-common.cuh; e=${C[$part]:?unknown variant $part}; fi
    before=$(md5sum < "$d/packages/kernels-cuda/kernels/$f")
    perl -0pi -e "$e" "$d/packages/kernels-cuda/kernels/$f"
    [ "$before" = "$(md5sum < "$d/packages/kernels-cuda/kernels/$f")" ] && { echo "variant $part: patch did not apply"; exit 1; }
  done
  [ -n "${DRY:-}" ] && continue
  (cd "$d" && timeout -s KILL 90 node "$root/.device/app/cuda-main.mjs" --phase proxy --proxySmall 0 --proxyNs "$n" \
    --proxyRef 0 --proxyLayouts wg --budget 80 --out "$root/$out/$v") > "$out/$v.log" 2>&1
  echo "$v: $(grep -oE "proxy_wg_pass1f_[a-z0-9_]+ [0-9.]+" "$out/$v.log" | head -n 1)"
done
