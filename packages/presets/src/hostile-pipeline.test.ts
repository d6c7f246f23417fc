/**
 * Hostile input to the pipeline's entries (sparsePrefill, planPrefill, runPlan, releasePlan)
 * on the reference backend, property-based (fast-check). Random valid shapes run and match
 * exact f64 attention on the plan's mask; random invalid shapes, options and policy fields
 * give the exact CrispError code, with a poisoned `out` left untouched (nothing written).
 */
import {
  type AttentionOptions,
  type CrispErrorCode,
  type DType,
  hostTensor,
  type PlanOptions,
  type Policy,
  planPrefill,
  releasePlan,
  runPlan,
  sparsePrefill,
  toFloat32,
} from '@crisp/core';
import { attentionRows, createReferenceBackend, sampleRows } from '@crisp/reference';
import { cStruct, fixed } from '@crisp/router';
import { globalCoverage, noiseFloor, topK } from '@crisp/select';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { basePolicy, codeOf, poisoned, problem, untouched } from './__fixtures__/hostile.js';

const TOL: Record<DType, number> = { f32: 2e-5, bf16: 2e-2, f16: 3e-3 };

describe('random valid shapes', () => {
  it('run through sparsePrefill and equal exact attention on the plan’s mask (dense where the plan is dense)', async () => {
    const shape = fc
      .record({
        n: fc.integer({ min: 200, max: 1024 }),
        heads: fc.constantFrom<[number, number]>([1, 1], [2, 1], [2, 2], [4, 2], [4, 1], [3, 3]),
        d: fc.constantFrom(16, 32),
        B: fc.constantFrom(16, 32, 64),
        dtype: fc.constantFrom<DType>('f32', 'f32', 'bf16', 'f16'),
        all: fc.boolean(),
        seed: fc.nat(),
      })
      .filter((s) => s.n * s.heads[0] * s.d <= 1024 * 4 * 16);
    await fc.assert(
      fc.asyncProperty(shape, async ({ n, heads: [H, Hkv], d, B, dtype, all, seed }) => {
        const be = createReferenceBackend();
        const x = problem(be, { n, H, Hkv, d, dtype, seed });
        // all: a VS selector keeping every block (the plan must then be dense attention)
        const policy: Policy = all
          ? { ...basePolicy(B), router: fixed('vs'), vs: topK({ k: Math.ceil(n / B) }) }
          : basePolicy(B);
        const out = poisoned(be, dtype, [n, H, d]);
        const res = await sparsePrefill(be, x, policy, { minSparseLength: 0, out });
        const got = toFloat32(await be.download(res.output));
        const rows = sampleRows(n, 24);
        const want = attentionRows(x.host.q, x.host.k, x.host.v, rows, all ? undefined : res.plan.mask);
        const tol = TOL[dtype];
        let worst = 0;
        for (let t = 0; t < rows.length; t++) {
          for (let c = 0; c < H * d; c++) worst = Math.max(worst, Math.abs(got[rows[t] * H * d + c] - want.output[t * H * d + c]));
        }
        expect(worst, `n ${n} H ${H}/${Hkv} d ${d} B ${B} ${dtype} seed ${seed}`).toBeLessThan(tol * 4);
        expect(Number.isFinite(res.plan.overallDensity)).toBe(true);
      }),
      { numRuns: 14 },
    );
  });
});

/** Invalid problems, each with the code the pipeline must give. */
const INVALID: ReadonlyArray<{ what: string; code: CrispErrorCode; q: number[]; k: number[]; v?: number[]; dq?: DType }> = [
  { what: 'v has other rows than k', code: 'SHAPE_MISMATCH', q: [256, 2, 16], k: [256, 2, 16], v: [255, 2, 16] },
  { what: 'H not a multiple of Hkv', code: 'SHAPE_MISMATCH', q: [256, 3, 16], k: [256, 2, 16] },
  { what: 'q and k head dims differ', code: 'SHAPE_MISMATCH', q: [256, 2, 16], k: [256, 2, 32] },
  { what: 'head dim 24 has no kernel', code: 'UNSUPPORTED', q: [256, 2, 24], k: [256, 2, 24] },
  { what: 'q longer than k', code: 'SHAPE_MISMATCH', q: [300, 2, 16], k: [256, 2, 16] },
  { what: 'q of rank 2', code: 'SHAPE_MISMATCH', q: [256, 32], k: [256, 2, 16] },
  { what: 'an empty head axis', code: 'SHAPE_MISMATCH', q: [256, 0, 16], k: [256, 0, 16] },
  { what: 'dtypes differ', code: 'DTYPE_MISMATCH', q: [256, 2, 16], k: [256, 2, 16], dq: 'bf16' },
  { what: 'n beyond the backend’s 65,536', code: 'LIMIT_EXCEEDED', q: [65537, 1, 16], k: [65537, 1, 16] },
];

describe('random invalid shapes', () => {
  it('give the exact code from sparsePrefill and planPrefill, before anything is computed or written', async () => {
    const be = createReferenceBackend();
    let calls = 0;
    // the backend's primitives are wrapped: an invalid problem must not reach any of them
    const counted = new Proxy(be, {
      get(target, key, recv) {
        const f = Reflect.get(target, key, recv);
        if (['proxyStats', 'peBlockRows', 'sparseAttention', 'denseAttention'].includes(key as string)) {
          return (...a: unknown[]) => {
            calls++;
            return (f as (...x: unknown[]) => unknown).apply(target, a);
          };
        }
        return typeof f === 'function' ? f.bind(target) : f;
      },
    });
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...INVALID), fc.boolean(), async (c, dense) => {
        const dq = c.dq ?? 'f32';
        const q = be.allocate(dq, c.q);
        const k = be.allocate('f32', c.k);
        const v = be.allocate('f32', c.v ?? c.k);
        const out = poisoned(be, dq, [c.q[0], c.q[1] ?? 1, c.q[2] ?? 1]);
        const policy = dense ? { name: 'dense', dense: true } : basePolicy();
        calls = 0;
        expect(await codeOf(sparsePrefill(counted, { q, k, v }, policy, { minSparseLength: 0, out })), c.what).toBe(c.code);
        expect(await codeOf(planPrefill(counted, { q, k, v }, policy, { minSparseLength: 0 })), c.what).toBe(c.code);
        expect(calls, `${c.what}: backend primitives called`).toBe(0);
        await untouched(be, out, c.what);
      }),
      { numRuns: 30 },
    );
  });
});

type Opt = { readonly label: string; readonly value: unknown; readonly code?: CrispErrorCode };
const opt = (label: string, value: unknown, code?: CrispErrorCode): Opt => ({ label, value, code });

describe('random options', () => {
  it('scale, minSparseLength, returnLse, out and prepared: the result on that mask, or the first check’s exact code', async () => {
    const be = createReferenceBackend();
    const other = createReferenceBackend();
    const [n, H, d] = [384, 2, 16];
    const x = problem(be, { n, H, d, seed: 7 });
    const policy = basePolicy();
    const outs = {
      valid: () => opt('a poisoned out', poisoned(be, 'f32', [n, H, d])),
      q: () => opt('out = q', x.q, 'INVALID_ARGUMENT'),
      v: () => opt('out = v', x.v, 'INVALID_ARGUMENT'),
      shape: () => opt('out of the wrong shape', poisoned(be, 'f32', [n, H, 32]), 'SHAPE_MISMATCH'),
      dtype: () => opt('out of the wrong dtype', poisoned(be, 'bf16', [n, H, d]), 'DTYPE_MISMATCH'),
      disposed: () => {
        const t = poisoned(be, 'f32', [n, H, d]);
        t.dispose();
        return opt('a disposed out', t, 'DISPOSED');
      },
      host: () => opt('a host tensor as out', hostTensor('f32', [1], [0]), 'INVALID_ARGUMENT'),
      foreign: () => opt('another backend instance’s out', other.allocate('f32', [n, H, d]), 'WRONG_BACKEND'),
      none: () => opt('no out', undefined),
    };
    const arb = fc.record({
      scale: fc.constantFrom(
        opt('no scale', undefined),
        opt('scale 0.1', 0.1),
        opt('scale NaN', Number.NaN, 'INVALID_ARGUMENT'),
        opt('scale -1', -1, 'INVALID_ARGUMENT'),
        opt('scale 0', 0, 'INVALID_ARGUMENT'),
        opt('scale Infinity', Number.POSITIVE_INFINITY, 'INVALID_ARGUMENT'),
        opt("scale '0.25'", '0.25', 'INVALID_ARGUMENT'),
      ),
      gate: fc.constantFrom(
        opt('gate 0', 0),
        opt('gate 1e9 (dense)', 1e9),
        opt('gate -1', -1, 'INVALID_ARGUMENT'),
        opt('gate NaN', Number.NaN, 'INVALID_ARGUMENT'),
        opt("gate '3'", '3', 'INVALID_ARGUMENT'),
      ),
      lse: fc.constantFrom(opt('lse', true), opt('no lse', undefined), opt("lse 'yes'", 'yes', 'INVALID_ARGUMENT')),
      prepared: fc.constantFrom(opt('no prepared', undefined), opt('a prepared of its own', {}, 'INVALID_ARGUMENT')),
      out: fc.constantFrom(...(Object.keys(outs) as (keyof typeof outs)[])),
    });
    await fc.assert(
      fc.asyncProperty(arb, async (a) => {
        const out = outs[a.out]();
        const parts = [a.scale, a.gate, a.lse, a.prepared, out];
        const opts = { scale: a.scale.value, minSparseLength: a.gate.value, returnLse: a.lse.value, prepared: a.prepared.value, out: out.value };
        const label = parts.map((p) => p.label).join(', ');
        // the options are checked in this order; another backend instance's out is the backend's to find
        const want = parts.find((p) => p.code !== undefined)?.code;
        const fresh = a.out === 'valid' || a.out === 'shape' || a.out === 'dtype' || a.out === 'foreign';
        let res: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
        const code = await codeOf(async () => {
          res = await sparsePrefill(be, x, policy, opts as PlanOptions & AttentionOptions);
        });
        expect(code, label).toBe(want);
        if (want !== undefined) {
          if (fresh) await untouched(a.out === 'foreign' ? other : be, out.value as never, label);
          // q, k and v are as uploaded (an out aliasing one of them wrote nothing)
          for (const t of ['q', 'k', 'v'] as const) {
            expect(Array.from(toFloat32(await be.download(x[t]))), `${label}: ${t}`).toEqual(Array.from(toFloat32(x.host[t])));
          }
          return;
        }
        const r = res!;
        if (a.out === 'valid') expect(r.output).toBe(out.value);
        expect(r.lse !== undefined, label).toBe(a.lse.value === true);
        const rows = sampleRows(n, 8);
        const wantOut = attentionRows(x.host.q, x.host.k, x.host.v, rows, r.plan.mask, { scale: a.scale.value as number | undefined });
        const got = toFloat32(await be.download(r.output));
        for (let t = 0; t < rows.length; t++) {
          for (let c = 0; c < H * d; c++) expect(Math.abs(got[rows[t] * H * d + c] - wantOut.output[t * H * d + c]), label).toBeLessThan(1e-4);
        }
      }),
      { numRuns: 120 },
    );
    // the options object itself
    for (const bad of [null, 3, 'fast', [1]]) {
      expect(await codeOf(sparsePrefill(be, x, policy, bad as never)), String(bad)).toBe('INVALID_ARGUMENT');
      expect(await codeOf(planPrefill(be, x, policy, bad as never)), String(bad)).toBe('INVALID_ARGUMENT');
    }
  });
});

/** One field of the base policy changed: the value, and whether the pipeline must refuse it (naming the field). */
const FIELD_CHANGES: ReadonlyArray<{ field: string; set: (p: Policy) => Policy; bad: boolean; names?: RegExp }> = [
  { field: 'blockSize 32', set: (p) => ({ ...p, blockSize: 32, kMin: 64, vs: noiseFloor({ kMin: 64 }), pe: globalCoverage({ kMin: 64 }) }), bad: false },
  { field: 'blockSize 48', set: (p) => ({ ...p, blockSize: 48 }), bad: true, names: /blockSize/ },
  { field: 'blockSize NaN', set: (p) => ({ ...p, blockSize: Number.NaN }), bad: true, names: /blockSize/ },
  { field: "blockSize '64'", set: (p) => ({ ...p, blockSize: '64' as never }), bad: true, names: /blockSize/ },
  { field: 'blockSize -64', set: (p) => ({ ...p, blockSize: -64 }), bad: true, names: /blockSize/ },
  { field: 'kMin 0', set: (p) => ({ ...p, kMin: 0 }), bad: true, names: /kMin/ },
  { field: 'kMin 1.5', set: (p) => ({ ...p, kMin: 1.5 }), bad: true, names: /kMin/ },
  { field: 'wSink NaN', set: (p) => ({ ...p, wSink: Number.NaN }), bad: true, names: /wSink/ },
  { field: 'wLocal -1', set: (p) => ({ ...p, wLocal: -1 }), bad: true, names: /wLocal/ },
  { field: 'wSink 64 against the router’s 128', set: (p) => ({ ...p, wSink: 64 }), bad: true, names: /wSink/ },
  { field: 'dense "yes"', set: (p) => ({ ...p, dense: 'yes' as never }), bad: true, names: /dense/ },
  { field: 'name ""', set: (p) => ({ ...p, name: '' }), bad: true, names: /name/ },
  { field: 'name 3', set: (p) => ({ ...p, name: 3 as never }), bad: true, names: /name/ },
  { field: 'no router', set: (p) => ({ ...p, router: undefined }), bad: true, names: /router/ },
  { field: 'router without route', set: (p) => ({ ...p, router: { name: 'r' } as never }), bad: true, names: /router/ },
  { field: 'router without a name', set: (p) => ({ ...p, router: { route: cStruct().route } as never }), bad: true, names: /name/ },
  { field: 'router needs.tokenScores "yes"', set: (p) => ({ ...p, router: { ...cStruct(), needs: { tokenScores: 'yes' as never } } }), bad: true, names: /tokenScores/ },
  { field: 'router needs.optionalStats ["all"]', set: (p) => ({ ...p, router: { ...cStruct(), needs: { optionalStats: ['all' as never] } } }), bad: true, names: /optionalStats/ },
  { field: 'router device tauProxy NaN', set: (p) => ({ ...p, router: { ...cStruct(), device: { kind: 'cStruct', tauProxy: Number.NaN } } }), bad: true, names: /device/ },
  { field: 'no VS selector', set: (p) => ({ ...p, vs: undefined }), bad: true, names: /selector/ },
  { field: 'selector device alpha -1', set: (p) => ({ ...p, vs: { ...noiseFloor({ kMin: 128 }), device: { kind: 'noiseFloor', alpha: -1, kMin: 128 } } }), bad: true, names: /device/ },
  { field: 'selector kMin 100 (not whole blocks)', set: (p) => ({ ...p, vs: noiseFloor({ kMin: 100 }) }), bad: true, names: /kMin = 100/ },
  { field: 'no PE selector', set: (p) => ({ ...p, pe: undefined }), bad: true, names: /PE selector/ },
  { field: 'pe.gamma 1', set: (p) => ({ ...p, pe: { ...p.pe!, gamma: 1 } }), bad: true, names: /gamma/ },
  { field: "pe.gamma '0.9'", set: (p) => ({ ...p, pe: { ...p.pe!, gamma: '0.9' as never } }), bad: true, names: /gamma/ },
  { field: 'pe.kMin 1.5', set: (p) => ({ ...p, pe: { ...p.pe!, kMin: 1.5 } }), bad: true, names: /pe\.kMin/ },
];

describe('random policy fields', () => {
  it('a policy with one field out of range is INVALID_ARGUMENT naming the field, before any statistic; the others run', async () => {
    const be = createReferenceBackend();
    const x = problem(be, { n: 384, H: 2, d: 16, seed: 3 });
    let stats = 0;
    const counted = { ...be, name: be.name, capabilities: be.capabilities, sparseCrossover: 0 } as typeof be;
    for (const key of ['upload', 'download', 'peBlockRows', 'sparseAttention', 'denseAttention', 'synchronize', 'allocate', 'write', 'expandMask', 'dispose'] as const) {
      (counted as unknown as Record<string, unknown>)[key] = (be[key] as (...a: unknown[]) => unknown).bind(be);
    }
    (counted as { proxyStats: typeof be.proxyStats }).proxyStats = (...a) => {
      stats++;
      return be.proxyStats(...a);
    };
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...FIELD_CHANGES), async (c) => {
        const policy = c.set(basePolicy());
        const out = poisoned(be, 'f32', [384, 2, 16]);
        stats = 0;
        let message = '';
        const code = await codeOf(async () => {
          try {
            await sparsePrefill(counted, x, policy, { minSparseLength: 0, out });
          } catch (e) {
            message = (e as Error).message;
            throw e;
          }
        });
        expect(code, c.field).toBe(c.bad ? 'INVALID_ARGUMENT' : undefined);
        if (c.bad) {
          expect(message, c.field).toMatch(c.names!);
          expect(stats, `${c.field}: statistics computed`).toBe(0);
          await untouched(be, out, c.field);
        }
      }),
      { numRuns: 60 },
    );
  });
});

describe('the entries called wrongly', () => {
  it('every misuse is the exact code, never a TypeError', async () => {
    const be = createReferenceBackend();
    const x = problem(be, { n: 256, H: 2, d: 16, seed: 1 });
    const p = basePolicy();
    const plan = await planPrefill(be, x, p, { minSparseLength: 0 });
    const disposed = problem(be, { n: 256, H: 2, d: 16, seed: 2 });
    disposed.k.dispose();
    const other = problem(createReferenceBackend(), { n: 256, H: 2, d: 16, seed: 2 });
    const fake = { ...x.q, backend: 'cuda', disposed: false, shape: [256, 2, 16], dtype: 'f32' };
    const cases: Array<[string, () => Promise<unknown>, CrispErrorCode]> = [
      ['sparsePrefill(null, …)', () => sparsePrefill(null as never, x, p), 'INVALID_ARGUMENT'],
      ['sparsePrefill({}, …)', () => sparsePrefill({} as never, x, p), 'INVALID_ARGUMENT'],
      ['sparsePrefill(be, null, …)', () => sparsePrefill(be, null as never, p), 'INVALID_ARGUMENT'],
      ['inputs without v', () => sparsePrefill(be, { q: x.q, k: x.k } as never, p), 'INVALID_ARGUMENT'],
      ['a host tensor as q', () => sparsePrefill(be, { ...x, q: x.host.q as never }, p), 'INVALID_ARGUMENT'],
      ['a number as k', () => sparsePrefill(be, { ...x, k: 3 as never }, p), 'INVALID_ARGUMENT'],
      ['a disposed k', () => sparsePrefill(be, { ...x, k: disposed.k }, p), 'DISPOSED'],
      ['a tensor of another backend name', () => sparsePrefill(be, { ...x, q: fake as never }, p), 'WRONG_BACKEND'],
      ['a tensor of another reference instance', () => sparsePrefill(be, { ...x, v: other.v }, p), 'WRONG_BACKEND'],
      ['policy null', () => sparsePrefill(be, x, null as never), 'INVALID_ARGUMENT'],
      ['policy a string', () => sparsePrefill(be, x, 'crisp' as never), 'INVALID_ARGUMENT'],
      ['planPrefill(be, null, …)', () => planPrefill(be, null as never, p), 'INVALID_ARGUMENT'],
      ['planPrefill without k', () => planPrefill(be, { q: x.q } as never, p), 'INVALID_ARGUMENT'],
      ['runPlan(be, null, …)', () => runPlan(be, null as never, x), 'INVALID_ARGUMENT'],
      ['runPlan on other inputs', () => runPlan(be, plan, problem(be, { n: 320, H: 2, d: 16, seed: 4 })), 'INVALID_ARGUMENT'],
      ['runPlan with out = k', () => runPlan(be, plan, x, { out: x.k }), 'INVALID_ARGUMENT'],
      ['runPlan(null, …)', () => runPlan(null as never, plan, x), 'INVALID_ARGUMENT'],
      ['releasePlan(undefined)', async () => releasePlan(undefined as never), 'INVALID_ARGUMENT'],
      ['createReferenceBackend(null)', async () => createReferenceBackend(null as never), 'INVALID_ARGUMENT'],
      ["createReferenceBackend({ sparseCrossover: '5' })", async () => createReferenceBackend({ sparseCrossover: '5' as never }), 'INVALID_ARGUMENT'],
      ['createReferenceBackend({ crossover: 5 })', async () => createReferenceBackend({ crossover: 5 } as never), 'INVALID_ARGUMENT'],
      ['allocate 2^31 elements', async () => be.allocate('f32', [2 ** 16, 2 ** 15, 1]), 'LIMIT_EXCEEDED'],
      ['allocate a __proto__ dtype', async () => be.allocate('__proto__' as never, [1]), 'DTYPE_MISMATCH'],
      ['write an Array', async () => be.write(be.allocate('f32', [2]), 0, [1, 2] as never), 'DTYPE_MISMATCH'],
    ];
    for (const [what, call, code] of cases) expect(await codeOf(call), what).toBe(code);
  });
});
