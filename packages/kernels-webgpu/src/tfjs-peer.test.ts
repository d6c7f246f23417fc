import { describe, expect, it } from 'vitest';
import { webgpuAvailability } from './node.js';
import { timeTfjsDenseAttention } from './tfjs-peer.js';

const availability = await webgpuAvailability();
if (!availability.available) console.warn(`[kernels-webgpu] skipping the TF.js peer test: ${availability.reason}`);

describe('timeTfjsDenseAttention', () => {
  it.skipIf(!availability.available)('matches float64 on checked rows and times n=128, H=2 (GQA 2:1), d=64', async () => {
    const seed = Math.floor(Math.random() * 2 ** 20);
    // warmMs adds untimed runs after `warmup` until it has passed: at least one more here
    const r = await timeTfjsDenseAttention({ n: 128, heads: 2, kvHeads: 1, headDim: 64, reps: 2, warmup: 1, warmMs: 1, seed });
    if (!('medianMs' in r)) throw new Error(`seed ${seed}: ${JSON.stringify(r)}`);
    expect(r.check.rows, `seed ${seed}`).toEqual([0, 64, 127]);
    expect(r.check.heads).toEqual([0, 1]);
    expect(r.check.maxRelError, `seed ${seed}`).toBeLessThan(2e-3);
    expect(r.runs).toHaveLength(2);
    expect(r.warmupRuns).toBeGreaterThanOrEqual(2);
    expect(r.minMs).toBeLessThanOrEqual(r.medianMs);
    expect(r.dtype).toBe('f32');
    // navigator.gpu was only lent to TF.js while it started (Node has none of its own).
    expect((globalThis as { navigator?: { gpu?: unknown } }).navigator?.gpu).toBeUndefined();
  }, 60_000);

  it.skipIf(!availability.available)('reports a failed check instead of timing when the tolerance cannot be met', async () => {
    // A negative tolerance rejects any output: proves the check gates the timing.
    const r = await timeTfjsDenseAttention({ n: 64, heads: 1, kvHeads: 1, headDim: 64, tolerance: -1 });
    expect('failed' in r && r.failed).toMatch(/float64 check/);
  }, 60_000);

  it('rejects bad sizes with INVALID_ARGUMENT', async () => {
    await expect(timeTfjsDenseAttention({ n: 0, heads: 1, kvHeads: 1, headDim: 64 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(timeTfjsDenseAttention({ n: 64, heads: 3, kvHeads: 2, headDim: 64 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(timeTfjsDenseAttention({ n: 64, heads: 1, kvHeads: 1, headDim: 64, warmMs: -1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});
