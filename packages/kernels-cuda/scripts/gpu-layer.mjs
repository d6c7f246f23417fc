// One Llama-shaped layer on a CUDA backend for the GPU machine's scripts (host-cost-gpu.mjs,
// idle-trace.mjs, host-ab-gpu.mjs, lifetime-gpu.mjs): q [n, 32, 128], k and v [n, 8, 128] in
// bf16 with the backend's llama-like fill (seed 7), and an output tensor; and how those scripts
// open a build bundled by apps/bench/scripts/host-ab-pack.sh.
export const H = 32;
export const Hkv = 8;
export const D = 128;

export function llamaLayer(be, n) {
  const q = be.allocate('bf16', [n, H, D]);
  const k = be.allocate('bf16', [n, Hkv, D]);
  const v = be.allocate('bf16', [n, Hkv, D]);
  be.fillLlamaLike(q, k, v, 7);
  const out = be.allocate('bf16', [n, H, D]);
  return { inputs: { q, k, v }, out };
}

/**
 * A build bundle's driver bindings: its stand-in driver's with CRISP_AB_STAND_IN=1 (no GPU,
 * to check a script's plumbing), else the real driver through its loadCuda.
 */
export function buildDriver(M) {
  return process.env.CRISP_AB_STAND_IN ? M.standInDriver({ heads: H }).libs : M.loadCuda();
}

/**
 * A build bundle's CudaBackend options: a build that embeds its kernel sources (0a9573f on;
 * host-ab-pack.sh exports them as KERNEL_SOURCES) compiles its own, so two commits' kernels
 * compare in one process; an older build compiles this tree's packages/kernels-cuda/kernels.
 * The default cubin cache (~/.cache/crisp/cuda, shared with crisp-bench), none on the stand-in
 * (its compiler returns no real code).
 */
export function buildOptions(M) {
  return {
    ...(M.KERNEL_SOURCES ? {} : { kernelDir: 'packages/kernels-cuda/kernels' }),
    ...(process.env.CRISP_AB_STAND_IN ? { cacheDir: null } : {}),
  };
}
