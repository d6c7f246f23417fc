/**
 * The attention kernels: 'fma' (the default, also run by primitives.test.ts and the
 * conformance suite; f16 and f32) against float64, dispatch splitting, non-finite inputs,
 * the option's validation, and the WGSL of the GPU forms (the unrolled FMA kernel, the
 * tensor-core subgroup-matrix kernel, and the proxy statistics' score passes in both tiles) through Tint on Dawn's null adapter, which offers
 * chromium-experimental-subgroup-matrix: the checks a GPU build applies before any driver
 * sees the code (uniformity of fragment offsets, enables, types).
 */
import { type BlockMask, CrispError, hostTensor, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { create } from 'webgpu';
import { describe, expect, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { fmaAttentionProgram } from './kernels/attention/fma.js';
import {
  SUBGROUP_MATRIX_FORMS,
  SUBGROUP_MATRIX_WORKGROUP_BYTES,
  subgroupMatrixAttentionProgram,
  subgroupMatrixHeadDim,
  subgroupMatrixWorkgroupBytes,
} from './kernels/attention/subgroup-matrix.js';
import type { StorageDType } from './kernels/common.js';
import { rowStatsProgram, scoresProgram } from './kernels/proxy.js';
import { DEFAULT_DAWN_FLAGS } from './node.js';
import { freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e;
}

describe.skipIf(!backend)(`attention kernels${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it('fma: dense (chunked prefill) and block-sparse f16 match float64', async () => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma' });
    expect(b1.attentionKernel).toBe('fma');
    const seed = freshSeed();
    const [n, m, H, Hkv, d] = [200, 137, 2, 1, 128];
    const q = hostTensor('f16', [m, H, d], seededValues(seed, m * H * d, 1.5));
    const k = hostTensor('f16', [n, Hkv, d], seededValues(seed + 1, n * Hkv * d, 1.5));
    const v = hostTensor('f16', [n, Hkv, d], seededValues(seed + 2, n * Hkv * d));
    const [gq, gk, gv] = [b1.upload(q), b1.upload(k), b1.upload(v)];
    const out = b1.allocate('f16', [m, H, d]);
    b1.write(out, 0, new Uint16Array(m * H * d).fill(0x7e00)); // NaN: every row must be written
    await b1.denseAttention(gq, gk, gv, { out });
    const rd = await ref.denseAttention(ref.upload(q), ref.upload(k), ref.upload(v));
    expect(maxAbsDiff(toFloat32(await b1.download(out)), toFloat32(await ref.download(rd.output))), `seed ${seed}`).toBeLessThan(2e-3);
    // rows of 2 blocks of 128: (I=0: [0]), (I=1: [1]) for head 0; (I=0: [0]), (I=1: [0, 1]) for head 1
    const mask: BlockMask = { heads: H, numBlocks: 2, blockSize: 128, rows: { rowPtr: Int32Array.from([0, 1, 2, 3, 5]), cols: Int32Array.from([0, 1, 0, 0, 1]) } };
    b1.write(out, 0, new Uint16Array(m * H * d).fill(0x7e00));
    await b1.sparseAttention(gq, gk, gv, mask, { out });
    const rs = await ref.sparseAttention(ref.upload(q), ref.upload(k), ref.upload(v), mask);
    expect(maxAbsDiff(toFloat32(await b1.download(out)), toFloat32(await ref.download(rs.output))), `seed ${seed}`).toBeLessThan(2e-3);
    b1.dispose();
  });

  it('fma: f32 storage (its own loaders: four vec4<f32> per row chunk) matches float64', async () => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma' });
    const seed = freshSeed();
    const [n, m, H, Hkv, d] = [150, 150, 2, 2, 128];
    const q = hostTensor('f32', [m, H, d], seededValues(seed, m * H * d, 1.5));
    const k = hostTensor('f32', [n, Hkv, d], seededValues(seed + 1, n * Hkv * d, 1.5));
    const v = hostTensor('f32', [n, Hkv, d], seededValues(seed + 2, n * Hkv * d));
    const out = b1.allocate('f32', [m, H, d]);
    b1.write(out, 0, new Float32Array(m * H * d).fill(Number.NaN));
    await b1.denseAttention(b1.upload(q), b1.upload(k), b1.upload(v), { out });
    const rd = await ref.denseAttention(ref.upload(q), ref.upload(k), ref.upload(v));
    expect(maxAbsDiff(toFloat32(await b1.download(out)), toFloat32(await ref.download(rd.output))), `seed ${seed}`).toBeLessThan(1e-4);
    b1.dispose();
  });

  // Dispatch splitting (grid [heads, query tiles], heads fastest, heaviest tiles first): with
  // maxDispatchWork in units of one 64 x 64 key tile (64·64·d multiply-adds; a head's
  // 5 query tiles hold 15), 6 units cut one head's tiles into ranges (a dispatch per head and
  // range), 40 units make groups of 2 heads with all their tiles, and no bound one dispatch.
  // Every (head, tile) must be computed exactly once: unwritten rows stay NaN, a wrong head
  // or tile offset gives wrong values.
  it.each([6, 40, 1e9])('fma: dispatches split at maxDispatchWork = %d tile units match float64 (dense, chunked, sparse)', async (units) => {
    const d = 64;
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma', maxDispatchWork: units * 64 * 64 * d });
    const seed = freshSeed();
    const [n, H, Hkv] = [300, 4, 2];
    const kv = hostTensor('f32', [n, Hkv, d], seededValues(seed + 1, n * Hkv * d, 1.5));
    const vv = hostTensor('f32', [n, Hkv, d], seededValues(seed + 2, n * Hkv * d));
    const [gk, gv] = [b1.upload(kv), b1.upload(vv)];
    const [rk, rv] = [ref.upload(kv), ref.upload(vv)];
    const mask: BlockMask = {
      heads: H,
      numBlocks: 3,
      blockSize: 128,
      vs: { verticalPtr: Int32Array.from([0, 1, 1, 2, 2]), vertical: Int32Array.from([0, 1]), slashPtr: Int32Array.from([0, 1, 2, 4, 5]), slash: Int32Array.from([0, 0, 0, 1, 0]) },
    };
    for (const [m, sparse] of [
      [n, false],
      [137, false],
      [n, true],
    ] as const) {
      const q = hostTensor('f32', [m, H, d], seededValues(seed + m, m * H * d, 1.5));
      const out = b1.allocate('f32', [m, H, d]);
      b1.write(out, 0, new Float32Array(m * H * d).fill(Number.NaN));
      const gq = b1.upload(q);
      if (sparse) await b1.sparseAttention(gq, gk, gv, mask, { out });
      else await b1.denseAttention(gq, gk, gv, { out });
      const rq = ref.upload(q);
      const want = sparse ? await ref.sparseAttention(rq, rk, rv, mask) : await ref.denseAttention(rq, rk, rv);
      expect(maxAbsDiff(toFloat32(await b1.download(out)), toFloat32(await ref.download(want.output))), `seed ${seed} m ${m} sparse ${sparse}`).toBeLessThan(1e-4);
      gq.dispose();
      out.dispose();
    }
    b1.dispose();
  });

  // Chunked-prefill dense (4 key tiles, so the next tile's prefetch and the buffer parity
  // turn over) and block-sparse (2-tile segments: a segment's first-tile path), then an Inf
  // in k and a NaN in q must poison exactly the query tiles that stage them.
  const cases: [StorageDType, number][] = [
    ['f16', 128],
    ['f32', 64],
    ['f16', 64],
    ['f32', 128],
  ];
  it.each(cases)('fma %s d%i: dense (chunked prefill), block-sparse and non-finite inputs match float64', async (dt, d) => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma' });
    const seed = freshSeed();
    const [n, m, H, Hkv] = [200, 137, 2, 1];
    const tol = dt === 'f16' ? 2e-3 : 1e-4;
    const poison = dt === 'f16' ? 0x7e00 : Number.NaN;
    const qv = seededValues(seed, m * H * d, 1.5);
    const kv = seededValues(seed + 1, n * Hkv * d, 1.5);
    const vv = seededValues(seed + 2, n * Hkv * d);
    // fill: NaN normally (every row must be written); 3.0 for the non-finite run, where the
    // expected answer is NaN and an unwritten row must not pass for a poisoned one.
    const run = async (kvals: Float32Array, vvals: Float32Array, mask?: BlockMask, nonFinite = false, qvals = qv) => {
      const fill = nonFinite ? (dt === 'f16' ? 0x4200 : 3) : poison;
      const q = hostTensor(dt, [m, H, d], qvals);
      const k = hostTensor(dt, [n, Hkv, d], kvals);
      const v = hostTensor(dt, [n, Hkv, d], vvals);
      const out = b1.allocate(dt, [m, H, d]);
      b1.write(out, 0, dt === 'f16' ? new Uint16Array(m * H * d).fill(fill) : new Float32Array(m * H * d).fill(fill));
      const [gq, gk, gv] = [b1.upload(q), b1.upload(k), b1.upload(v)];
      if (mask) await b1.sparseAttention(gq, gk, gv, mask, { out });
      else await b1.denseAttention(gq, gk, gv, { out });
      const got = toFloat32(await b1.download(out));
      for (const t of [gq, gk, gv, out]) t.dispose();
      // the reference refuses non-finite inputs (NON_FINITE): no reference for that run
      if (nonFinite) return { got, want: new Float32Array(0) };
      const [rq, rk, rv] = [ref.upload(q), ref.upload(k), ref.upload(v)];
      const want = toFloat32(await ref.download((mask ? await ref.sparseAttention(rq, rk, rv, mask) : await ref.denseAttention(rq, rk, rv)).output));
      return { got, want };
    };
    const dense = await run(kv, vv);
    expect(maxAbsDiff(dense.got, dense.want), `seed ${seed}`).toBeLessThan(tol);
    const mask: BlockMask = { heads: H, numBlocks: 2, blockSize: 128, rows: { rowPtr: Int32Array.from([0, 1, 2, 3, 5]), cols: Int32Array.from([0, 1, 0, 0, 1]) } };
    const sparse = await run(kv, vv, mask);
    expect(maxAbsDiff(sparse.got, sparse.want), `seed ${seed}`).toBeLessThan(tol);
    // Non-finite inputs poison the (query tile, head) pairs that stage them. Query row r sits
    // at position r + 63, so rows 1..64 form query tile 1. An Inf in k at key 127 is masked
    // for rows 1..63 and a NaN in q row 64 is read by no other row: without the check,
    // rows 1..63 would come back finite. Rows of other tiles stay right.
    const row = H * d;
    const kb = kv.slice();
    kb[127 * Hkv * d + 5] = Number.POSITIVE_INFINITY;
    const badK = await run(kb, vv, undefined, true);
    expect(maxAbsDiff(badK.got.subarray(0, row), dense.want.subarray(0, row)), `seed ${seed}`).toBeLessThan(tol);
    // tiles 2 and 3 stage key tile 1 too (Hkv = 1: both heads)
    for (let r = 1; r < m; r++) expect(badK.got.subarray(r * row, (r + 1) * row).every(Number.isNaN), `k: row ${r}, seed ${seed}`).toBe(true);
    const qb = qv.slice();
    qb[64 * row + 3] = Number.NaN; // row 64, head 0
    const badQ = await run(kv, vv, undefined, true, qb);
    for (let r = 0; r < m; r++) {
      const head0 = badQ.got.subarray(r * row, r * row + d);
      if (r >= 1 && r <= 64) expect(head0.every(Number.isNaN), `q: row ${r}, seed ${seed}`).toBe(true);
      else expect(maxAbsDiff(head0, dense.want.subarray(r * row, r * row + d)), `q: row ${r}, seed ${seed}`).toBeLessThan(tol);
      expect(maxAbsDiff(badQ.got.subarray(r * row + d, (r + 1) * row), dense.want.subarray(r * row + d, (r + 1) * row)), `q: row ${r} head 1, seed ${seed}`).toBeLessThan(tol);
    }
    b1.dispose();
  });

  it('the default is the tensor-core kernel where the adapter offers it, else the FMA kernel', async () => {
    const f = backend!.gpu.device.features;
    const eligible = f.has('shader-f16') && f.has('subgroups') && f.has('chromium-experimental-subgroup-matrix');
    if (!eligible) expect(backend!.attentionKernel).toBe('fma');
    const forced = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma' });
    expect(forced.attentionKernel).toBe('fma');
    expect(forced.attentionKernelFor('f16', 128)).toBe('fma');
    forced.dispose();
    // f32 and head dims other than 64 and 128 run the FMA kernel whatever the adapter offers
    expect(backend!.attentionKernelFor('f32', 128)).toBe('fma');
    expect(backend!.attentionKernelFor('f16', 96)).toBe('fma');
    expect(backend!.attentionKernelFor('f16', 128)).toBe(backend!.attentionKernel);
    const want = fmaAttentionProgram('f16', 128, backend!.gpu.compact).wgsl;
    expect(backend!.attentionProgramFor('fma', 'f16', 128).wgsl).toBe(want);
  });

  it('subgroup-matrix (tensor cores) runs only where the adapter is eligible, else fma', async () => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'subgroup-matrix' });
    const f = backend!.gpu.device.features;
    if (!f.has('shader-f16') || !f.has('chromium-experimental-subgroup-matrix')) expect(b1.attentionKernel).toBe('fma');
    expect(b1.attentionProgramFor('subgroup-matrix', 'f16', 128).wgsl).toBe(subgroupMatrixAttentionProgram(128).wgsl);
    b1.dispose();
  });

  it('the proxy statistics use the tensor-core tiles exactly where the tensor-core attention runs', () => {
    const want = backend!.attentionKernelFor('f16', 128) === 'subgroup-matrix' ? 'subgroup-matrix' : 'fma';
    expect(backend!.statisticsKernelFor('f16', 128)).toBe(want);
    expect(backend!.statisticsKernelFor('f32', 128)).toBe('fma');
    expect(backend!.statisticsKernelFor('f16', 96)).toBe('fma');
  });

  it('a tensor-core statistics build the driver rejects falls back to the FMA tiles, says why, and the statistics still match float64', async () => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device });
    const gpu = b1.gpu;
    // pretend the adapter is eligible, and make its driver reject the tensor-core programs
    gpu.subgroupMatrix = true;
    const build = gpu.pipeline.bind(gpu);
    const asked: string[] = [];
    gpu.pipeline = (p) => {
      asked.push(p.name);
      return /-subgroup-matrix$/.test(p.name) ? Promise.reject(new Error('rejected by the test driver')) : build(p);
    };
    expect(b1.statisticsKernelFor('f16', 64)).toBe('subgroup-matrix');
    const seed = freshSeed();
    const [n, H, Hkv, D] = [300, 4, 2, 64];
    const q = hostTensor('f16', [n, H, D], seededValues(seed, n * H * D));
    const k = hostTensor('f16', [n, Hkv, D], seededValues(seed + 1, n * Hkv * D));
    const opts = { blockSize: 64, wSink: 64, wLocal: 64 };
    const got = await b1.proxyStats(b1.upload(q), b1.upload(k), opts);
    const want = await ref.proxyStats(ref.upload(q), ref.upload(k), opts);
    expect(asked).toContain('rowStats-subgroup-matrix');
    expect(asked).toContain('rowStats');
    expect(b1.statisticsKernelFor('f16', 64)).toBe('fma');
    expect(b1.kernelNote).toMatch(/proxy statistics unavailable, using fma: .*rejected by the test driver/);
    expect(maxAbsDiff(got.cStruct, want.cStruct)).toBeLessThan(2e-3);
    expect(maxAbsDiff(got.verticalBlocks, want.verticalBlocks)).toBeLessThan(2e-3);
    expect(maxAbsDiff(got.slashBlocks, want.slashBlocks)).toBeLessThan(2e-3);
    b1.dispose();
  });

  it('an unknown attentionKernel is an INVALID_ARGUMENT naming the choices', async () => {
    const err = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'tensor' as never }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CrispError);
    expect((err as CrispError).code).toBe('INVALID_ARGUMENT');
    expect((err as CrispError).message).toMatch(/fma, subgroup-matrix/);
  });
});

/** Bytes of workgroup memory a program declares. */
function workgroupBytes(wgsl: string): number {
  const size: Record<string, number> = { f32: 4, u32: 4, f16: 2, 'vec2<u32>': 8, 'vec4<u32>': 16, 'vec4<f32>': 16, 'vec2<f32>': 8, 'atomic<u32>': 4 };
  let bytes = 0;
  for (const m of wgsl.matchAll(/var<workgroup> \w+: (?:array<(.+), (\d+)>|(\w+(?:<\w+>)?));/g)) {
    const one = m[1] !== undefined ? size[m[1]] * Number(m[2]) : size[m[3]];
    if (!(one > 0)) throw new Error(`unknown workgroup type in ${m[0]}`);
    bytes += one;
  }
  return bytes;
}

// Dawn's null adapter compiles WGSL with Tint (no driver): every feature is offered.
const nullGpu = create(['backend=null', ...DEFAULT_DAWN_FLAGS]);
const nullAdapter = await nullGpu.requestAdapter().catch(() => null);
const wanted = ['shader-f16', 'subgroups', 'chromium-experimental-subgroup-matrix'] as GPUFeatureName[];
const nullOk = nullAdapter !== null && wanted.every((f) => nullAdapter.features.has(f));
// One device for the whole file, never destroyed, and the instance kept reachable: dawn.node
// crashed the worker when a null-backend device was destroyed while SwiftShader's lived on.
const nullDevice = nullOk ? await nullAdapter!.requestDevice({ requiredFeatures: wanted }) : undefined;
(globalThis as { __crispNullDawn?: unknown[] }).__crispNullDawn = [nullGpu, nullAdapter, nullDevice];

describe.skipIf(!nullOk)('kernel WGSL through Tint (Dawn null adapter)', () => {
  async function errorsOf(code: string): Promise<string[]> {
    const info = await nullDevice!.createShaderModule({ code }).getCompilationInfo();
    return info.messages.filter((m) => m.type === 'error').map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
  }

  it('every form of the subgroup-matrix attention kernel validates (fragment offsets subgroup-uniform), d = 64 and 128', async () => {
    for (const form of SUBGROUP_MATRIX_FORMS) {
      for (const d of [64, 128]) {
        const errs = await errorsOf(subgroupMatrixAttentionProgram(d, form).wgsl);
        expect(errs, `${form} d${d}`).toEqual([]);
      }
    }
  });

  it('each form declares the workgroup memory its eligibility check assumes', () => {
    for (const form of SUBGROUP_MATRIX_FORMS) {
      for (const d of [64, 128]) {
        const bytes = workgroupBytes(subgroupMatrixAttentionProgram(d, form).wgsl);
        expect(bytes, `${form} d${d}`).toBeGreaterThan(0);
        expect(bytes, `${form} d${d}`).toBeLessThanOrEqual(subgroupMatrixWorkgroupBytes(form, d));
        expect(subgroupMatrixWorkgroupBytes(form, d), `${form} d${d}`).toBeLessThanOrEqual(48 * 1024);
      }
    }
  });

  it("the tensor-core proxy statistics passes validate, d = 64 and 128, within the tensor-core kernel's workgroup memory", async () => {
    for (const d of [64, 128]) {
      for (const p of [rowStatsProgram('f16', d, false, 'subgroup-matrix'), scoresProgram('f16', d, false, 'subgroup-matrix')]) {
        expect(p.name).toMatch(/-subgroup-matrix$/);
        expect(await errorsOf(p.wgsl), `${p.name} d${d}`).toEqual([]);
        // (the eligibility check admits an adapter by the attention kernel's need)
        expect(workgroupBytes(p.wgsl), `${p.name} d${d}`).toBeLessThanOrEqual(SUBGROUP_MATRIX_WORKGROUP_BYTES);
      }
    }
    expect(() => rowStatsProgram('f32', 128, false, 'subgroup-matrix')).toThrow(/f16/);
    expect(() => scoresProgram('f16', 96, false, 'subgroup-matrix')).toThrow(/64 and 128/);
  });

  it('the FMA proxy statistics passes validate, unrolled and rolled, f16 and f32', async () => {
    for (const dt of ['f16', 'f32'] as const) {
      for (const compact of [false, true]) {
        for (const p of [rowStatsProgram(dt, 128, compact), scoresProgram(dt, 128, compact)]) {
          expect(await errorsOf(p.wgsl), `${p.name} ${dt}${compact ? ' rolled' : ''}`).toEqual([]);
        }
      }
    }
  });

  it('the subgroup-matrix kernel is built for d = 64 and 128 only', () => {
    expect(subgroupMatrixHeadDim(96)).toBe(false);
    expect(() => subgroupMatrixAttentionProgram(96)).toThrow(/64 and 128/);
  });

  it('the Tint check can fail: offsets from local_invocation_index are rejected', async () => {
    const bad = subgroupMatrixAttentionProgram(128, 'direct').wgsl.replace('let sg = sgid;', 'let sg = lid / 32u;');
    expect(bad).not.toBe(subgroupMatrixAttentionProgram(128, 'direct').wgsl);
    const errs = await errorsOf(bad);
    expect(errs.join('\n')).toMatch(/uniform/);
  });

  it('the unrolled (GPU) FMA kernels validate, f16 and f32, d = 64 and 128, single-sequence and varlen', async () => {
    for (const dt of ['f16', 'f32'] as const) {
      for (const d of [64, 128]) {
        for (const varlen of [false, true]) {
          expect(await errorsOf(fmaAttentionProgram(dt, d, false, varlen).wgsl), `${dt} d${d}${varlen ? ' varlen' : ''}`).toEqual([]);
        }
      }
    }
  });
});
