/**
 * The demo's DOM-free half on the float64 reference backend (Node, no GPU): the same code the
 * page runs, so its bookkeeping (host copy, sampled rows, errors, density, needle recall) is
 * checked on every machine, Chromium or not.
 */
import { CrispError, causalBlockCount, type DType } from '@crisp/core';
import { attentionRows, createReferenceBackend } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { describe, expect, it, vi } from 'vitest';
import { DEFAULT_CONFIG, type DemoConfig, type DemoResult, parseConfig, resolveDType, runDemo } from './run-demo.js';
import { checkCliffData, relErr, testSeed } from './test-support.js';

const SEED = testSeed();

function expectInvalid(query: string, message: RegExp): void {
  let err: unknown;
  try {
    parseConfig(new URLSearchParams(query));
  } catch (e) {
    err = e;
  }
  expect(err, query).toBeInstanceOf(CrispError);
  expect((err as CrispError).code).toBe('INVALID_ARGUMENT');
  expect((err as CrispError).message).toMatch(message);
}

describe('parseConfig', () => {
  it('reads every field and keeps the defaults for the rest', () => {
    expect(parseConfig(new URLSearchParams())).toEqual(DEFAULT_CONFIG);
    const c = parseConfig(
      new URLSearchParams('profile=retrieval&preset=flexPrefill&n=8192&heads=16&kvHeads=4&headDim=128&dtype=f16&seed=-5&warmup=0&lengthGate=1'),
    );
    expect(c).toMatchObject({ profile: 'retrieval', preset: 'flexPrefill', n: 8192, heads: 16, kvHeads: 4, headDim: 128, dtype: 'f16', seed: -5 });
    expect(c.warmup).toBe(false);
    expect(c.lengthGate).toBe(true);
  });

  it('rejects bad values with INVALID_ARGUMENT and says what is allowed', () => {
    expectInvalid('n=abc', /n must be an integer in \[256, 1048576\]; got 'abc'/);
    expectInvalid('n=100', /n must be an integer/);
    expectInvalid('preset=fast', /preset must be one of crisp, crispFast, flexPrefill, dense; got 'fast'/);
    expectInvalid('profile=gpt', /profile must be one of llama-like/);
    expectInvalid('headDim=96', /headDim must be one of 64, 128/);
    expectInvalid('heads=6&kvHeads=4', /heads \(6\) must be a multiple of kvHeads \(4\)/);
    expectInvalid('warmup=maybe', /warmup must be 1 or 0/);
  });

  it('auto dtype is f16 only with shader-f16', () => {
    expect(resolveDType({ dtype: 'auto' }, ['subgroups'])).toBe('f32');
    expect(resolveDType({ dtype: 'auto' }, ['shader-f16'])).toBe('f16');
    expect(resolveDType({ dtype: 'f32' }, ['shader-f16'])).toBe('f32');
  });
});

describe('runDemo on the reference backend', () => {
  const cfg = (over: Partial<DemoConfig>): DemoConfig => ({
    ...DEFAULT_CONFIG,
    n: 1280,
    heads: 2,
    kvHeads: 1,
    headDim: 64,
    seed: SEED,
    sampleRows: 5,
    repeats: 1,
    warmup: false,
    ...over,
  });

  it.each([
    ['llama-like', 'crisp', 'f32'],
    ['retrieval', 'flexPrefill', 'f16'],
  ] as const)('%s with %s in %s: errors, density and needle recall match a float64 recomputation', async (profile, preset, dtype) => {
    const backend = createReferenceBackend();
    const messages: string[] = [];
    const { result: r, samples: s } = await runDemo(backend, cfg({ profile, preset }), dtype as DType, (m) => messages.push(m));
    expect(messages.at(-1)).toBe('done');
    expect(messages.some((m) => m.startsWith('generating and uploading rows: 1280 / 1280'))).toBe(true);
    expect(r.config.dtype).toBe(dtype);
    expect(r.denseReason).toBeNull();
    // The reference computes in float64 and stores f32 outputs: only that rounding remains.
    const tol = dtype === 'f32' ? 1e-6 : 2e-3;
    expect(r.kernelError).toBeLessThan(tol);
    expect(r.denseKernelError).toBeLessThan(tol);

    const sc = scenario(profile, { n: 1280, heads: 2, kvHeads: 1, headDim: 64, dtype, seed: SEED });
    const all = sc.rows(0, 1280);
    const dense = attentionRows(all.q, all.k, all.v, s.rows);
    expect(r.outputError).toBeCloseTo(relErr(s.sparse, dense.output), 6);
    expect(relErr(s.dense, dense.output)).toBeLessThan(tol);
    const Nb = s.mask!.numBlocks;
    for (const h of r.heads) {
      const nnz = s.mask!.rowPtr[(h.head + 1) * Nb] - s.mask!.rowPtr[h.head * Nb];
      expect(h.density).toBeCloseTo(nnz / causalBlockCount(Nb), 12);
      expect(h.density).toBeGreaterThan(0);
      expect(h.density).toBeLessThanOrEqual(1);
      expect(['vs', 'pe']).toContain(h.route);
      expect(h.massRecall).toBeGreaterThan(0);
      expect(h.massRecall).toBeLessThanOrEqual(1 + 1e-12);
    }
    expect(checkCliffData(r.heads, s.mask!)).toBeNull();
    // the achieved rates: each head's computed blocks over the sparse time, the causal FLOPs over the dense time
    expect(r.attentionKernel).toBe(backend.name);
    expect(r.statisticsKernel).toBe(backend.name);
    const flops = (heads: number) => 4 * 64 * heads * ((1280 * 1281) / 2);
    expect(r.denseTflops).toBeCloseTo(flops(2) / r.denseMs / 1e9, 12);
    const computed = (r.heads[0].density + r.heads[1].density) * flops(1);
    expect(r.sparseTflops).toBeCloseTo(computed / r.attentionMs / 1e9, 12);
    expect(r.sparseTflops).toBeGreaterThan(0);
    expect(r.needleRecall.recall).toBeGreaterThanOrEqual(0);
    expect(r.needleRecall.recall).toBeLessThanOrEqual(1);
    expect(r.needleRecall.total).toBe(sc.truth.needles.reduce((a, nd) => a + nd.readers.length, 0));
  });

  it('times the plan and the attention apart, each with the device work it queued', async () => {
    // A backend that, like WebGPU, returns before its device work is done: proxyStats leaves
    // PLAN ms of work (the plan's) and sparseAttention ATTENTION ms, which only synchronize()
    // waits for. The clock moves only there, so the split is exact whatever the machine's load.
    const [PLAN, ATTENTION] = [1500, 100];
    const reference = createReferenceBackend();
    let clock = 0;
    let queued = 0;
    const queueing = new Proxy(reference, {
      get(target, key) {
        if (key === 'proxyStats' || key === 'sparseAttention') {
          const work = key === 'proxyStats' ? PLAN : ATTENTION;
          const f = Reflect.get(target, key, target) as (...args: unknown[]) => Promise<unknown>;
          return async (...args: unknown[]) => {
            const out = await f.apply(target, args);
            queued += work;
            return out;
          };
        }
        if (key === 'synchronize') {
          return async () => {
            clock += queued;
            queued = 0;
          };
        }
        const value = Reflect.get(target, key, target);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const now = vi.spyOn(performance, 'now').mockImplementation(() => clock);
    let r: DemoResult;
    try {
      r = (await runDemo(queueing, cfg({}), 'f32')).result;
    } finally {
      now.mockRestore();
    }
    expect(r.denseReason).toBeNull();
    expect(r.planMs).toBe(PLAN);
    expect(r.attentionMs).toBe(ATTENTION);
    expect(r.sparseMs).toBe(PLAN + ATTENTION);
    const computed = r.heads.reduce((a, h) => a + h.density, 0) * 4 * 64 * ((1280 * 1281) / 2);
    expect(r.sparseTflops).toBeCloseTo(computed / ATTENTION / 1e9, 12);
  });

  it('the dense preset gives a dense plan whose output equals float64 dense', async () => {
    const { result: r, samples: s } = await runDemo(createReferenceBackend(), cfg({ preset: 'dense' }), 'f32');
    expect(r.denseReason).toBe('policy');
    expect(r.overallDensity).toBe(1);
    expect(r.heads.every((h) => h.route === 'dense' && h.cStruct === null)).toBe(true);
    expect(s.mask).toBeNull();
    expect(r.outputError).toBeLessThan(1e-6);
    expect(r.needleRecall.recall).toBe(1);
  });

  it('the length gate makes the plan dense below the backend crossover, and only when asked', async () => {
    const backend = createReferenceBackend({ sparseCrossover: 4096 });
    const gated = await runDemo(backend, cfg({ lengthGate: true }), 'f32');
    expect(gated.result.denseReason).toBe('length-gate');
    expect(gated.result.sparseCrossover).toBe(4096);
    const forced = await runDemo(backend, cfg({ lengthGate: false }), 'f32');
    expect(forced.result.denseReason).toBeNull();
    expect(forced.result.overallDensity).toBeLessThanOrEqual(1);
  });
});
