/**
 * The varlen suite on the float64 reference at tiny sizes: the run end to end (bench.json and
 * bench.md), the varlen output equal to the single-sequence outputs, chunked prefill, and the
 * notes a backend without varlenAttention or a planner that refuses sparse chunks leaves.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Backend, InvalidArgumentError } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_SUITES, parseRange } from './config.js';
import { main, resolveConfig } from './main.js';
import type { BenchResult } from './result.js';
import { varlenSuite } from './suites/varlen.js';
import { cuSeqlens, drawLengths } from './suites/varlen-support.js';

const root = mkdtempSync(join(tmpdir(), 'crisp-bench-varlen-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const read = (dir: string): BenchResult => JSON.parse(readFileSync(join(dir, 'bench.json'), 'utf8'));
const tiny = ['--backends', 'reference', '--suites', 'varlen', '--reference-shape', '4,2,64', '--reps', '3', '--warmup', '1', '--quiet'];

describe('the varlen suite settings', () => {
  it('is asked for by name, not in the default set, and reads its flags', () => {
    expect(DEFAULT_SUITES).not.toContain('varlen');
    expect(resolveConfig({ suites: 'varlen' }).suites).toEqual(['varlen']);
    const c = resolveConfig({ varlenBatch: '5', varlenSeed: '3', varlenRange: '1k..2k', chunkedN: '64k', chunks: '8', varlenPolicy: 'dense' }).varlen;
    expect(c).toEqual({ batch: 5, seed: 3, range: [1024, 2048], chunkedN: 65536, chunks: 8, policy: 'dense' });
    expect(resolveConfig({}).varlen).toEqual({ batch: 8, seed: 7, range: [4096, 131072], chunkedN: 131072, chunks: 4, policy: 'crisp' });
    expect(() => parseRange('2k..1k')).toThrow(/min <= max/);
    expect(() => resolveConfig({ varlenPolicy: 'flex' })).toThrow(/unknown varlen policy/);
    expect(() => resolveConfig({ chunks: '9', chunkedN: '8' })).toThrow(/--chunks 9/);
    expect(() => resolveConfig({ varlenBatch: '2.5' })).toThrow(/integer/);
  });
  it('draws the same lengths for a seed, inside the range', () => {
    const a = drawLengths(8, [4096, 131072], 7);
    expect(drawLengths(8, [4096, 131072], 7)).toEqual(a);
    expect(drawLengths(8, [4096, 131072], 8)).not.toEqual(a);
    for (const n of a) expect(n >= 4096 && n <= 131072 && Number.isInteger(n)).toBe(true);
    expect(cuSeqlens([3, 5, 2])).toEqual([0, 3, 8, 10]);
  });
});

describe('crisp-bench --suites varlen on the reference', () => {
  it('times the batch three ways, its varlen output equal to the single-sequence outputs, and writes the section', async () => {
    const out = join(root, 'batch');
    const args = ['node', 'crisp-bench', ...tiny, '--varlen-batch', '3', '--varlen-range', '300..1500', '--varlen-policy', 'crisp-b64', '--chunked-n', '768', '--chunks', '4', '--out', out];
    expect(await main(args)).toBe(0);
    const r = read(out);
    const v = r.suites.varlen!;
    expect(v.command).toBe(r.command);
    expect(v.batches).toHaveLength(1);
    const b = v.batches[0];
    expect(b).toMatchObject({ backend: 'reference', dtype: 'f32', shape: { heads: 4, kvHeads: 2, headDim: 64 }, policy: 'crisp-b64', lengthSeed: 7 });
    expect(b.lengths).toEqual(drawLengths(3, [300, 1500], 7));
    for (const t of [b.varlen!.ms, b.singles!.ms, b.dense!.ms]) {
      expect(t.runs).toBe(3);
      expect(t.median).toBeGreaterThan(0);
    }
    expect(b.varlen!.planShare).toBeGreaterThan(0);
    expect(b.varlen!.planShare).toBeLessThan(1);
    expect(b.varlen!.planShare).toBeCloseTo(b.varlen!.planMs / b.varlen!.totalMs, 12);
    // same plans, same float64 kernels: the same values
    expect(b.check).toMatchObject({ maxAbsDiff: 0, allRows: true, rows: b.lengths.reduce((a, x) => a + x, 0) });
    expect(b.sequences.map((s) => s.n)).toEqual(b.lengths);
    expect(b.sequences.map((s) => s.seed)).toEqual([r.config.seed, r.config.seed + 1, r.config.seed + 2]);
    for (const s of b.sequences) {
      expect(s.density).toBeGreaterThan(0);
      expect(s.density).toBeLessThanOrEqual(1);
      expect(s.relErrVsDense).toBeGreaterThanOrEqual(0);
      expect(s.relErrVsDense).toBeLessThan(0.2);
    }
    expect(b.overallDensity).toBeLessThan(1);
    expect(b.peers).toEqual([]);
    expect(v.notes).toContain('reference: PyTorch SDPA peers: CUDA only');
    // chunked prefill on the sparse path: each chunk against its KV prefix, with its own plan
    const c = v.chunked[0];
    expect(c).toMatchObject({ backend: 'reference', n: 768, chunks: 4, policy: 'crisp-b64' });
    expect(c.refused).toBeUndefined();
    expect(c.chunked!.perChunk.map((x) => [x.queries, x.keys])).toEqual([[192, 192], [192, 384], [192, 576], [192, 768]]);
    for (const x of c.chunked!.perChunk) expect(x.density > 0 && x.density <= 1 && x.ms > 0).toBe(true);
    expect(c.chunked!.ms.runs).toBe(3);
    expect(c.full!.ms.runs).toBe(3);
    expect(c.relErrVsDense!.chunked).toBeLessThan(0.2);
    expect(c.relErrVsDense!.full).toBeLessThan(0.2);
    const md = readFileSync(join(out, 'bench.md'), 'utf8');
    expect(md).toContain('## Varlen batches and chunked prefill');
    expect(md).toContain(`Reproduce: \`${r.command}\``);
    expect(md).toContain('| 0 (every row; ');
    expect(md).toContain('**reference, chunked prefill** (n=768 in 4 chunks');
  }, 300_000);

  it('runs chunked prefill with the dense policy: each chunk against its KV prefix, equal to one dense prefill', async () => {
    const out = join(root, 'dense');
    const args = ['node', 'crisp-bench', ...tiny, '--varlen-batch', '1', '--varlen-range', '300..300', '--varlen-policy', 'dense', '--chunked-n', '1000', '--chunks', '4', '--out', out];
    expect(await main(args)).toBe(0);
    const v = read(out).suites.varlen!;
    expect(v.batches[0].check!.maxAbsDiff).toBe(0);
    const c = v.chunked[0];
    expect(c.refused).toBeUndefined();
    expect(c.chunked!.perChunk.map((x) => [x.queries, x.keys, x.density])).toEqual([
      [250, 250, 1],
      [250, 500, 1],
      [250, 750, 1],
      [250, 1000, 1],
    ]);
    expect(c.chunked!.ms.runs).toBe(3);
    expect(c.full!.density).toBe(1);
    // exact attention over the same keys, in float64: the chunks agree with dense to rounding
    expect(c.relErrVsDense!.chunked).toBeLessThan(1e-6);
    expect(c.relErrVsDense!.full).toBeLessThan(1e-6);
  }, 300_000);
});

describe('the varlen suite on a backend without varlenAttention, and a planner that refuses sparse chunks', () => {
  it('records notes and still times the full prefill', async () => {
    const ref = createReferenceBackend();
    // the reference less its varlenAttention, and refusing sparse chunks as a planner without chunked plans does
    const b = new Proxy(ref, {
      get: (t, p) => {
        if (p === 'varlenAttention') return undefined;
        if (p === 'proxyStats') {
          return (q: Parameters<Backend['proxyStats']>[0], k: Parameters<Backend['proxyStats']>[1], o: Parameters<Backend['proxyStats']>[2]) => {
            if (q.shape[0] !== k.shape[0]) throw new InvalidArgumentError('sparse plans need q and k of equal length here');
            return t.proxyStats(q, k, o);
          };
        }
        const x = Reflect.get(t, p, t);
        return typeof x === 'function' ? x.bind(t) : x;
      },
    }) as Backend;
    const config = { ...resolveConfig({ smoke: true, referenceShape: '2,1,64', chunkedN: '640', chunks: '2', varlenPolicy: 'crisp-b64' }) };
    const lines: string[] = [];
    const r = await varlenSuite({ config, command: 'test', log: (l) => lines.push(l) }, [{ name: 'reference', backend: b }], undefined);
    expect(r.batches).toEqual([]);
    expect(r.notes[0]).toMatch(/^reference: batch skipped: the backend has no varlenAttention/);
    const c = r.chunked[0];
    expect(c.refused).toMatchObject({ chunk: 1, code: 'INVALID_ARGUMENT', message: expect.stringMatching(/sparse plans need q and k of equal length/) });
    expect(c.chunked).toBeUndefined();
    expect(c.full!.ms.runs).toBe(config.latency.reps);
    expect(c.relErrVsDense!.chunked).toBeUndefined();
    expect(r.notes.some((x) => /chunk 1 \(q 320 rows, k 640\) refused: INVALID_ARGUMENT/.test(x))).toBe(true);
    // the notes are progress lines too
    expect(lines.some((l) => l.includes('batch skipped'))).toBe(true);
    ref.dispose();
  }, 300_000);
});
