/**
 * Chunked prefill on the reference: one sequence prefilled in 2, 3, 5 and 8 uneven chunks
 * (each chunk's q the rows [p, e), k and v the rows [0, e)) gives, per chunk, the output of
 * the definition (exact attention over the chunk's own plan mask, the plan being the policy's
 * rules applied to that chunk), and dense chunks give the dense full prefill's rows. Then the
 * LSE merge on host tensors, and the typed errors chunked input can meet.
 */
import {
  type Backend,
  type DeviceTensor,
  type HostTensor,
  hostTensor,
  isCrispError,
  mergeAttentionByLse,
  planPrefill,
  type Policy,
  runPlan,
  selectVsLists,
  sparsePrefill,
  toFloat32,
  vsHead,
} from '@crisp/core';
import { attentionRows, createReferenceBackend, sampleRows } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { maxMixedError } from './compare.js';
import { crispSmall, flexPrefillSmall } from './policies.js';
import { attentionInputs, randomSeed, rng } from './random.js';

const SEED = Number(process.env.CRISP_SEED ?? randomSeed());
const msg = (what: string) => `${what} (seed ${SEED}; rerun with CRISP_SEED=${SEED})`;

const [n, H, Hkv, d] = [1500, 4, 2, 32];

/** Rows [r0, r1) of a [rows, heads, dim] host tensor. */
function rowsOf(t: HostTensor, r0: number, r1: number): HostTensor {
  const per = t.shape[1] * t.shape[2];
  return { dtype: t.dtype, shape: [r1 - r0, t.shape[1], t.shape[2]], data: t.data.subarray(r0 * per, r1 * per) };
}

/** An output tensor filled with NaN, so a row the prefill skips cannot pass. */
function poisoned(be: Backend, shape: readonly number[]): DeviceTensor {
  const t = be.allocate('f32', shape);
  be.write(t, 0, new Float32Array(shape.reduce((a, b) => a * b, 1)).fill(Number.NaN));
  return t;
}

/**
 * `count` chunk boundaries 0 = c0 < c1 < ... < c_count = n, uneven, most not multiples of B;
 * with 3 chunks or more the first ends at 200, short enough for the min-length rule (dense).
 */
function chunkEnds(count: number, r: () => number): number[] {
  const cuts = new Set<number>(count >= 3 ? [200] : []);
  while (cuts.size < count - 1) cuts.add(201 + Math.floor(r() * (n - 260)));
  return [0, ...[...cuts].sort((a, b) => a - b), n];
}

/** Â of the chunk's last b rows, materialised: C_struct and the block scores by their definitions. */
function bruteStats(q: HostTensor, k: HostTensor, B: number, wSink: number, wLocal: number) {
  const [m] = q.shape;
  const [nk] = k.shape;
  const Nb = Math.ceil(nk / B);
  const b = Math.min(B, m);
  const Q = toFloat32(q);
  const K = toFloat32(k);
  const cStruct = new Float64Array(H);
  const pv = new Float64Array(H * Nb);
  const ps = new Float64Array(H * Nb);
  const scale = 1 / Math.sqrt(d);
  for (let h = 0; h < H; h++) {
    const g = Math.floor(h / (H / Hkv));
    for (let t = 0; t < b; t++) {
      const i = m - b + t;
      const pos = nk - m + i;
      const logits: number[] = [];
      for (let j = 0; j <= pos; j++) {
        let s = 0;
        for (let c = 0; c < d; c++) s += Q[(i * H + h) * d + c] * K[(j * Hkv + g) * d + c];
        logits.push(s * scale);
      }
      const mx = Math.max(...logits);
      const e = logits.map((x) => Math.exp(x - mx));
      const z = e.reduce((a, x) => a + x, 0);
      for (let j = 0; j <= pos; j++) {
        const p = e[j] / z / b;
        pv[h * Nb + Math.floor(j / B)] += p;
        ps[h * Nb + Math.floor((pos - j) / B)] += p;
        if (j < wSink || j >= Math.max(nk - wLocal, Math.min(wSink, nk))) cStruct[h] += p;
      }
    }
  }
  return { cStruct, pv, ps, b };
}

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

describe.each([crispSmall, flexPrefillSmall])('chunked prefill with $name (reference)', (policy: Policy) => {
  const r = rng(SEED ^ policy.name.length);
  const x = attentionInputs(r, 'f32', { n, heads: H, kvHeads: Hkv, headDim: d });
  const B = policy.blockSize!;

  it.each([2, 3, 5, 8])('%i chunks: each chunk is its own plan run exactly; dense chunks are the full prefill rows', async (count) => {
    const be = createReferenceBackend();
    const full = await be.denseAttention(be.upload(x.q), be.upload(x.k), be.upload(x.v));
    const fullOut = toFloat32(await be.download(full.output));
    const ends = chunkEnds(count, r);
    let sparseChunks = 0;
    for (let c = 0; c < count; c++) {
      const [p, e] = [ends[c], ends[c + 1]];
      const m = e - p;
      const hq = rowsOf(x.q, p, e);
      const hk = rowsOf(x.k, 0, e);
      const hv = rowsOf(x.v, 0, e);
      const inputs = { q: be.upload(hq), k: be.upload(hk), v: be.upload(hv) };
      const out = poisoned(be, [m, H, d]);
      const res = await sparsePrefill(be, inputs, policy, { minSparseLength: 0, out, returnLse: true });
      expect(res.output).toBe(out);
      const got = toFloat32(await be.download(res.output));
      const what = `chunk ${c} [${p}, ${e}) of ${ends.join(',')}`;
      expect(got.every(Number.isFinite), msg(`${what}: every row written`)).toBe(true);
      const plan = res.plan;
      expect(plan.shape.queries).toBe(m);
      expect(plan.shape.keys).toBe(e);
      if (!plan.mask) {
        // dense: the full prefill's rows, bit for bit (the reference's rows do not depend on the chunking)
        expect(plan.denseReason, msg(what)).toBe('min-length');
        expect(Array.from(got), msg(what)).toEqual(Array.from(fullOut.subarray(p * H * d, e * H * d)));
        continue;
      }
      sparseChunks++;
      const Nb = Math.ceil(e / B);
      const I0 = Math.floor(p / B);
      // the plan is the policy's rules applied to this chunk: statistics of its own last b rows
      // (by their definition), its routes, its VS lists, PE rows over its own query blocks
      const st = plan.stats!;
      const want = bruteStats(hq, hk, B, policy.router!.needs?.wSink ?? policy.wSink ?? 128, policy.router!.needs?.wLocal ?? policy.wLocal ?? 128);
      expect(st.proxyRows).toBe(want.b);
      expect(maxDiff(st.verticalBlocks, want.pv), msg(`${what}: p_v`)).toBeLessThan(1e-6);
      expect(maxDiff(st.slashBlocks, want.ps), msg(`${what}: p_s`)).toBeLessThan(1e-6);
      expect(maxDiff(st.cStruct, want.cStruct), msg(`${what}: C_struct`)).toBeLessThan(1e-6);
      const routes = policy.router!.route(st).routes;
      expect(plan.routing!.routes).toEqual(routes);
      const lists = selectVsLists(st, routes, policy.vs!, Math.ceil(policy.pe!.kMin / B));
      for (let h = 0; h < H; h++) expect(vsHead(plan.mask.vs!, h)).toEqual(vsHead(lists, h));
      const peHeads = routes.flatMap((x, h) => (x === 'pe' ? [h] : []));
      if (peHeads.length > 0) {
        const pe = await be.peBlockRows(inputs.q, inputs.k, { blockSize: B, gamma: policy.pe!.gamma, heads: peHeads });
        const rows = plan.mask.rows!;
        peHeads.forEach((h, s) => {
          for (let I = 0; I < Nb; I++) {
            const mine = Array.from(rows.cols.subarray(rows.rowPtr[h * Nb + I], rows.rowPtr[h * Nb + I + 1]));
            expect(mine).toEqual(Array.from(pe.cols.subarray(pe.rowPtr[s * Nb + I], pe.rowPtr[s * Nb + I + 1])));
            // query blocks before the chunk hold no rows and keep nothing
            if (I < I0) expect(mine).toEqual([]);
          }
        });
      }
      // the output and LSE: exact attention over that mask
      const exact = attentionRows(hq, hk, hv, sampleRows(m, m), plan.mask);
      const err = maxMixedError(got, exact.output);
      expect(err.error, msg(`${what}: output`)).toBeLessThan(1e-5);
      const lse = toFloat32(await be.download(res.lse!));
      expect(maxMixedError(lse, exact.lse).error, msg(`${what}: lse`)).toBeLessThan(1e-5);
    }
    expect(sparseChunks, msg(`chunks ${ends.join(',')}`)).toBeGreaterThan(0);
    be.dispose();
  });
});

/** Host attention of every query row over the keys `keep` selects (causal): f64, empty sets give lse -Infinity, output 0. */
function partAttention(q: HostTensor, k: HostTensor, v: HostTensor, keep: (j: number) => boolean) {
  const [m] = q.shape;
  const [nk] = k.shape;
  const [Q, K, V] = [toFloat32(q), toFloat32(k), toFloat32(v)];
  const out = new Float32Array(m * H * d);
  const lse = new Float32Array(H * m);
  for (let h = 0; h < H; h++) {
    const g = Math.floor(h / (H / Hkv));
    for (let i = 0; i < m; i++) {
      const pos = nk - m + i;
      const js: number[] = [];
      const logits: number[] = [];
      for (let j = 0; j <= pos; j++) {
        if (!keep(j)) continue;
        let s = 0;
        for (let c = 0; c < d; c++) s += Q[(i * H + h) * d + c] * K[(j * Hkv + g) * d + c];
        js.push(j);
        logits.push(s / Math.sqrt(d));
      }
      if (js.length === 0) {
        lse[h * m + i] = Number.NEGATIVE_INFINITY;
        continue;
      }
      const mx = Math.max(...logits);
      const e = logits.map((x) => Math.exp(x - mx));
      const z = e.reduce((a, x) => a + x, 0);
      lse[h * m + i] = mx + Math.log(z);
      for (let c = 0; c < d; c++) {
        let s = 0;
        for (let t = 0; t < js.length; t++) s += e[t] * V[(js[t] * Hkv + g) * d + c];
        out[(i * H + h) * d + c] = s / z;
      }
    }
  }
  return { output: hostTensor('f32', [m, H, d], out), lse: hostTensor('f32', [H, m], lse) };
}

describe('mergeAttentionByLse', () => {
  const r = rng(SEED ^ 0x5eed);
  const nk = 300;
  const x = attentionInputs(r, 'f32', { n: nk, heads: H, kvHeads: Hkv, headDim: d });
  const all = attentionRows(x.q, x.k, x.v, sampleRows(nk, nk));

  it('attention over a prefix and the rest, merged, is attention over every key; rows with one part empty take the other', () => {
    // the prefix [0, 100): query rows before position 100 have no key in the rest (lse -Infinity)
    const a = partAttention(x.q, x.k, x.v, (j) => j < 100);
    const b = partAttention(x.q, x.k, x.v, (j) => j >= 100);
    expect(toFloat32(b.lse)[50]).toBe(Number.NEGATIVE_INFINITY);
    const merged = mergeAttentionByLse([a, b]);
    expect(merged.output.shape).toEqual([nk, H, d]);
    expect(maxMixedError(toFloat32(merged.output), all.output).error, msg('output')).toBeLessThan(1e-5);
    expect(maxMixedError(toFloat32(merged.lse), all.lse).error, msg('lse')).toBeLessThan(1e-5);
  });

  it('merges three interleaved key sets in any order, and a row with no keys anywhere gives 0 and -Infinity', () => {
    const parts = [0, 1, 2].map((s) => partAttention(x.q, x.k, x.v, (j) => j % 3 === s));
    for (const order of [[0, 1, 2], [2, 0, 1]]) {
      const merged = mergeAttentionByLse(order.map((i) => parts[i]));
      expect(maxMixedError(toFloat32(merged.output), all.output).error, msg('output')).toBeLessThan(1e-5);
      expect(maxMixedError(toFloat32(merged.lse), all.lse).error, msg('lse')).toBeLessThan(1e-5);
    }
    const none = partAttention(x.q, x.k, x.v, () => false);
    const merged = mergeAttentionByLse([none, { ...none, output: { ...none.output, data: new Float32Array(nk * H * d).fill(Number.NaN) } }]);
    expect(Array.from(toFloat32(merged.output)).every((v) => v === 0)).toBe(true);
    expect(Array.from(toFloat32(merged.lse)).every((v) => v === Number.NEGATIVE_INFINITY)).toBe(true);
  });

  it('refuses parts that do not fit together with typed errors', () => {
    const a = partAttention(x.q, x.k, x.v, (j) => j < 100);
    const code = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return isCrispError(e) ? e.code : String(e);
      }
      return 'nothing thrown';
    };
    expect(code(() => mergeAttentionByLse([]))).toBe('INVALID_ARGUMENT');
    expect(code(() => mergeAttentionByLse([a, { output: rowsOf(a.output, 0, 10), lse: a.lse }]))).toBe('SHAPE_MISMATCH');
    expect(code(() => mergeAttentionByLse([a, { output: a.output, lse: hostTensor('f32', [nk, H], toFloat32(a.lse)) }]))).toBe('SHAPE_MISMATCH');
    expect(code(() => mergeAttentionByLse([a, { output: a.output, lse: hostTensor('f16', [H, nk], new Float32Array(H * nk)) }]))).toBe('DTYPE_MISMATCH');
    const bad = Float32Array.from(toFloat32(a.lse));
    bad[7] = Number.NaN;
    expect(code(() => mergeAttentionByLse([a, { output: a.output, lse: hostTensor('f32', [H, nk], bad) }]))).toBe('NON_FINITE');
    // data shorter than the shape says (read past its end, the merge would use undefined as 0)
    const short = { dtype: 'f32' as const, shape: [H, nk], data: toFloat32(a.lse).subarray(0, H * nk - 3) };
    expect(() => mergeAttentionByLse([a, { output: a.output, lse: short }])).toThrow(/part 1's lse: shape \[\d+,\d+\] holds \d+ values but the array has \d+/);
    const wrongArray = { ...a.output, data: new Uint16Array(a.output.data.length) };
    expect(code(() => mergeAttentionByLse([a, { output: wrongArray, lse: a.lse }]))).toBe('DTYPE_MISMATCH');
    // a misspelt option is refused, not ignored (the dtype would silently stay the first part's)
    expect(() => mergeAttentionByLse([a, a], { dType: 'bf16' } as never)).toThrow(/unknown option 'dType' \(did you mean 'dtype'\?\)/);
  });
});

describe('chunked input errors', () => {
  it('refuses q longer than k, an empty q, k and v of different lengths and a plan run on another chunk, before any work', async () => {
    const be = createReferenceBackend();
    const r = rng(SEED ^ 0xbad);
    const x = attentionInputs(r, 'f32', { n: 400, m: 300, heads: H, kvHeads: Hkv, headDim: d });
    const k = be.upload(x.k);
    const v = be.upload(x.v);
    const code = async (p: Promise<unknown>) => p.then(() => 'nothing thrown', (e) => (isCrispError(e) ? e.code : String(e)));
    const long = be.upload(attentionInputs(r, 'f32', { n: 400, m: 400, heads: H, kvHeads: Hkv, headDim: d }).q);
    const longer = be.upload(hostTensor('f32', [401, H, d], new Float32Array(401 * H * d)));
    expect(await code(sparsePrefill(be, { q: longer, k, v }, crispSmall, { minSparseLength: 0 }))).toBe('SHAPE_MISMATCH');
    expect(await code(sparsePrefill(be, { q: be.upload(hostTensor('f32', [0, H, d], [])), k, v }, crispSmall))).toBe('SHAPE_MISMATCH');
    const shortV = be.upload(rowsOf(x.v, 0, 399));
    expect(await code(sparsePrefill(be, { q: be.upload(x.q), k, v: shortV }, crispSmall, { minSparseLength: 0 }))).toBe('SHAPE_MISMATCH');
    const plan = await planPrefill(be, { q: be.upload(x.q), k }, crispSmall, { minSparseLength: 0 });
    expect(plan.shape.queries).toBe(300);
    expect(await code(runPlan(be, plan, { q: long, k, v }))).toBe('INVALID_ARGUMENT');
    be.dispose();
  });
});
