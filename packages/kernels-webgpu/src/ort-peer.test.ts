import { describe, expect, it } from 'vitest';
import { webgpuAvailability } from './node.js';
import { gqaModel } from './onnx-graph.js';
import { timeOrtAttention } from './ort-peer.js';

const availability = await webgpuAvailability();
if (!availability.available) console.warn(`[kernels-webgpu] skipping the ONNX Runtime Web peer's GPU tests: ${availability.reason}`);

/** Seeded uniform values in [-1, 1) (mulberry32). */
function values(len: number, seed: number): Float32Array {
  let a = seed >>> 0;
  return Float32Array.from({ length: len }, () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * 2 - 1;
  });
}

const shape = { n: 256, heads: 4, kvHeads: 2, headDim: 64 };
const inputs = (seed: number) => ({
  q: values(shape.n * shape.heads * shape.headDim, seed),
  k: values(shape.n * shape.kvHeads * shape.headDim, seed + 1),
  v: values(shape.n * shape.kvHeads * shape.headDim, seed + 2),
  dtype: 'f32' as const,
});

describe('gqaModel', () => {
  it('writes one com.microsoft GroupQueryAttention node with its head counts', () => {
    const bytes = gqaModel({ heads: 4, kvHeads: 2, headDim: 64, dtype: 'f16' });
    const text = new TextDecoder('latin1').decode(bytes);
    expect(text).toContain('GroupQueryAttention');
    expect(text).toContain('com.microsoft');
    expect(text).toContain('kv_num_heads');
    // q's last dimension H·d = 256 as a varint (0x80 0x02) after dim_value's tag (0x08)
    expect([...bytes.subarray(0)].join(',')).toContain([0x08, 0x80, 0x02].join(','));
  });
});

describe('timeOrtAttention', () => {
  // ORT's FlashAttention shader takes SwiftShader a minute or more to compile on a loaded
  // 2-core machine (the runs after it take milliseconds): the timeout is for that.
  it.skipIf(!availability.available)(
    'equals float64 causal GQA attention on checked rows, and against given expected rows, at n=256, H=4, H_kv=2, d=64',
    async () => {
      const seed = Math.floor(Math.random() * 2 ** 20);
      const x = inputs(seed);
      // warmMs adds untimed runs after `warmup` until it has passed: at least one more here
      const r = await timeOrtAttention({ ...shape, inputs: x, reps: 2, warmup: 1, warmMs: 1 });
      if (!('medianMs' in r)) throw new Error(`seed ${seed}: ${JSON.stringify(r)}`);
      const tol = r.dtype === 'f16' ? 1e-2 : 2e-3;
      expect(r.check.rows, `seed ${seed}`).toEqual([0, 128, 255]);
      expect(r.check.heads).toEqual([0, 3]);
      expect(r.check.maxRelError, `seed ${seed}`).toBeLessThan(tol);
      expect(r.runs).toHaveLength(2);
      expect(r.warmupRuns).toBeGreaterThanOrEqual(2);
      expect(r.runs.every((ms) => ms > 0)).toBe(true);
      expect(r.ortVersion).toBe('1.30.0');
      console.log(`[kernels-webgpu] ORT-web GQA on ${r.adapter}: ${r.dtype}, median ${r.medianMs.toFixed(2)} ms, max rel err ${r.check.maxRelError.toExponential(1)}`);
      // navigator.gpu was only lent while ORT started (Node 20 has none of its own).
      expect((globalThis as { navigator?: { gpu?: unknown } }).navigator?.gpu).toBeUndefined();

      // Expected rows that are not attention (the inputs' v rows) fail the check: nothing timed.
      const rows = [5, 200];
      const wrong = new Float32Array(rows.length * shape.heads * shape.headDim).fill(3);
      const bad = await timeOrtAttention({ ...shape, inputs: x, expected: { rows, values: wrong } });
      expect('failed' in bad && bad.failed).toMatch(/differs from the expected rows/);
      expect(r.check.withinTolerance).toBe(true);
      // timeBeyondTolerance: timed anyway, the check's verdict and error beside the time
      const past = await timeOrtAttention({ ...shape, inputs: x, expected: { rows, values: wrong }, reps: 2, timeBeyondTolerance: true });
      if (!('medianMs' in past)) throw new Error(`seed ${seed}: ${JSON.stringify(past)}`);
      expect(past.check.withinTolerance).toBe(false);
      expect(past.check.relErrVsExpected!).toBeGreaterThan(past.check.tolerance);
      expect(past.check.maxRelError, `seed ${seed}`).toBeLessThan(tol);
      expect(past.runs).toHaveLength(2);
      expect(past.warmupRuns).toBe(1);
    },
    300_000,
  );

  it('reports absent with the reason when no WebGPU adapter is found', async () => {
    const noAdapter = { requestAdapter: async () => null } as unknown as GPU;
    const r = await timeOrtAttention({ ...shape, gpu: noAdapter, inputs: inputs(1) });
    expect('absent' in r && r.absent).toMatch(/no WebGPU adapter/);
  });

  it('rejects bad sizes and inputs with INVALID_ARGUMENT', async () => {
    const x = inputs(1);
    await expect(timeOrtAttention({ ...shape, n: 0, inputs: x })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(timeOrtAttention({ ...shape, heads: 3, inputs: x })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    for (const warmMs of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      await expect(timeOrtAttention({ ...shape, inputs: x, warmMs })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
    await expect(timeOrtAttention({ ...shape, inputs: { ...x, q: x.q.subarray(1) } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(timeOrtAttention({ ...shape, inputs: { ...x, dtype: 'f16' } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
