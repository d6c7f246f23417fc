#!/usr/bin/env bash
# Bundles the CUDA backend's host code of each given commit for host-ab-gpu.mjs (two builds in
# one process on the GPU machine, their prefills alternated from an idle device), and the
# script itself:
#   bash apps/bench/scripts/host-ab-pack.sh 7c2feea HEAD
# writes .device/app/ab-<short commit>.mjs for each and .device/app/host-ab-gpu.mjs; then, after
# packing `.device` (../shared/device/pack.sh) and on the GPU machine from the repository root:
#   node .device/app/host-ab-gpu.mjs .device/app/ab-7c2feea.mjs .device/app/ab-<head>.mjs 131072 200
# Commits only (the working tree's changes are not in them). Each commit is checked out in a
# temporary worktree with its own install (pnpm, offline from the store this checkout filled),
# so builds that differ in any package bundle as they were.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 COMMIT [COMMIT...]" >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
cd "$root"
mkdir -p .device/app
node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/host-ab-gpu.mjs .device/app/host-ab-gpu.mjs
for c in "$@"; do
  short=$(git rev-parse --short "$c")
  wt=$(mktemp -d /tmp/crisp-ab-XXXXXX)
  git worktree add --detach "$wt" "$short" >/dev/null
  (
    cd "$wt"
    pnpm install --frozen-lockfile --offline --ignore-scripts >/dev/null
    # (standInDriver: CRISP_AB_STAND_IN=1 runs host-ab-gpu.mjs here, without a GPU)
    printf "export { CudaBackend } from './src/cuda-backend.ts';\nexport { loadCuda } from './src/ffi.ts';\nexport { standInDriver } from './src/stand-in-driver.ts';\n" > packages/kernels-cuda/ab-entry.ts
    # (the build's own pipeline and preset too, where the commit has them as sources: a change
    # to @crisp/core's path to the pass's launch is then in its build only; before session 24
    # both builds ran the script's own sparsePrefill)
    printf "export { sparsePrefill } from '../core/src/index.ts';\nexport { crisp } from '../presets/src/index.ts';\n" >> packages/kernels-cuda/ab-entry.ts
    # (a commit that embeds its kernel sources hands them over: host-ab-gpu.mjs then compiles
    # that build's own kernels, so kernel changes compare in one process too)
    if [ -f packages/kernels-cuda/src/kernel-sources.generated.ts ]; then
      printf "export { KERNEL_SOURCES } from './src/kernel-sources.generated.ts';\n" >> packages/kernels-cuda/ab-entry.ts
    fi
    node apps/bench/scripts/bundle.mjs packages/kernels-cuda/ab-entry.ts "$root/.device/app/ab-$short.mjs"
  )
  git worktree remove --force "$wt"
  echo "$c -> .device/app/ab-$short.mjs"
done
