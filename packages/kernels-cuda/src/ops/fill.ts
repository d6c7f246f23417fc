/**
 * Input fills and output checks for benchmarks and tests (kernels/fill/fill.cu): not part of
 * core's Backend and not on the attention path.
 */
import { type DeviceTensor, InvalidArgumentError, UnsupportedError, attentionShape, numel } from '@crisp/core';
import type { CudaContext } from '../runtime/context.js';
import { check } from '../runtime/ffi.js';
import { F, I, P, U64 } from '../runtime/launcher.js';

/** Fill a bf16/f16 tensor with crisp_hash values (the formula the PyTorch peer shares). */
export function fillHash(cx: CudaContext, t: DeviceTensor, seed: number, amplitude: number): void {
  const ct = cx.tensor(t, 'fill target');
  ct.markWritten();
  if (ct.dtype === 'f32') throw new UnsupportedError('fillHash fills bf16 or f16 tensors');
  cx.launch('fill/fill.cu', `fill_hash_${ct.dtype}`, [4096], 256, 0, [
    P(ct.ptr),
    U64(numel(ct.shape)),
    I(seed >>> 0),
    F(amplitude),
  ]);
}

/** Fill q, k, v with the llama-like structured layer of kernels/bench.cu. */
export function fillLlamaLike(cx: CudaContext, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, seed: number, slash0 = 1000, vEvery = 4096): void {
  const shape = attentionShape(q, k, v);
  const { keys: n, heads: H, kvHeads: Hkv, headDim: D, dtype } = shape;
  const tensors = [cx.tensor(q, 'q'), cx.tensor(k, 'k'), cx.tensor(v, 'v')];
  tensors.forEach((t, which) => {
    t.markWritten();
    cx.launch('fill/fill.cu', `fill_llama_${dtype}`, [4096], 256, 0, [
      P(t.ptr),
      I(which),
      I(n),
      I(which === 0 ? H : Hkv),
      I(D),
      I(H),
      I(seed >>> 0),
      I(slash0),
      I(vEvery),
    ]);
  });
}

/**
 * Keep the device's main stream busy for `ms` milliseconds (one thread spinning on the global
 * timer). Queued before a timed call, it lets the host get ahead, so device marks around the
 * call measure the device's critical path without the host's launch time (a benchmark tool).
 */
export function deviceSleep(cx: CudaContext, ms: number): void {
  if (!(Number.isFinite(ms) && ms >= 0 && ms <= 1000)) throw new InvalidArgumentError(`deviceSleep takes 0..1000 ms; got ${ms}`);
  cx.launch('fill/fill.cu', 'spin_ns', [1], 1, 0, [U64(Math.round(ms * 1e6))]);
}

/** Overwrite a tensor with NaN so unwritten outputs show. */
export function poison(cx: CudaContext, t: DeviceTensor): void {
  const ct = cx.tensor(t, 'poison target');
  ct.markWritten();
  const cu = cx.libs.cu;
  const n = numel(ct.shape);
  if (ct.dtype === 'f32') check(cx.libs, cu.cuMemsetD32Async(ct.ptr, 0x7fc00000, n, cx.streams.main), 'cuMemsetD32Async');
  else check(cx.libs, cu.cuMemsetD16Async(ct.ptr, ct.dtype === 'bf16' ? 0x7fc0 : 0x7e00, n, cx.streams.main), 'cuMemsetD16Async');
}

/** ‖a − b‖ / ‖b‖ in f64 over two same-shape bf16/f16 tensors, and a's non-finite count. */
export function relError(cx: CudaContext, a: DeviceTensor, b: DeviceTensor): { relErr: number; nonFinite: number; refNorm: number } {
  const at = cx.tensor(a, 'a');
  const bt = cx.tensor(b, 'b');
  if (at.dtype !== bt.dtype || numel(at.shape) !== numel(bt.shape) || at.dtype === 'f32') {
    throw new InvalidArgumentError('relError compares two bf16 or f16 tensors of one shape');
  }
  const grid = 1024;
  const part = cx.scratch(grid * 3 * 8);
  try {
    cx.launch('fill/fill.cu', `rel_err_${at.dtype}`, [grid], 256, 0, [P(at.ptr), P(bt.ptr), U64(numel(at.shape)), P(part.ptr)]);
    const h = cx.read(part.ptr, new Float64Array(grid * 3));
    let e = 0;
    let r = 0;
    let bad = 0;
    for (let i = 0; i < grid; i++) {
      e += h[3 * i];
      r += h[3 * i + 1];
      bad += h[3 * i + 2];
    }
    return { relErr: Math.sqrt(e / r), nonFinite: bad, refNorm: Math.sqrt(r) };
  } finally {
    cx.pool.release(part);
  }
}
