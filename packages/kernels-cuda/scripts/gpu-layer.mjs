// One Llama-shaped layer on a CUDA backend for the GPU machine's scripts (host-cost-gpu.mjs,
// idle-trace.mjs): q [n, 32, 128], k and v [n, 8, 128] in bf16 with the backend's llama-like
// fill (seed 7), and an output tensor.
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
