/**
 * The selectable attention kernels: fma-v4 (the default, also run by primitives.test.ts and
 * the conformance suite), fma-v1 and fma-v3 (f16 and f32) against float64, the option's validation, and the WGSL of
 * the GPU forms (unrolled v3, the subgroup-matrix kernel) through Tint on Dawn's null
 * adapter, which offers chromium-experimental-subgroup-matrix: the checks the H200 build
 * applies before any driver sees the code (uniformity of fragment offsets, enables, types).
 */
import { type BlockMask, CrispError, hostTensor, toFloat32 } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';
import { create } from 'webgpu';
import { describe, expect, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { attentionSmmProgram } from './kernels/attention-smm.js';
import { attentionV3Program } from './kernels/attention-v3.js';
import { attentionV4Program } from './kernels/attention-v4.js';
import { DEFAULT_DAWN_FLAGS } from './node.js';
import { freshSeed, seededValues, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();
const ref = createReferenceBackend();

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e;
}

describe.skipIf(!backend)(`attention kernel variants${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it.each(['fma-v1', 'fma-v3', 'fma-v4'] as const)('%s: dense (chunked prefill) and block-sparse f16 match float64', async (kernel) => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: kernel });
    expect(b1.attentionKernel).toBe(kernel);
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

  it('fma-v4: f32 storage (its own loaders: four vec4<f32> per row chunk) matches float64', async () => {
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma-v4' });
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

  it('the default and the alias fma are fma-v4 (the kernel the H200 measured fastest)', async () => {
    expect(backend!.attentionKernel).toBe('fma-v4');
    const b1 = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'fma' });
    expect(b1.attentionKernel).toBe('fma-v4');
    b1.dispose();
  });

  it('an unknown attentionKernel is an INVALID_ARGUMENT naming the choices', async () => {
    const err = await createWebGpuBackend({ device: backend!.gpu.device, attentionKernel: 'tensor' as never }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CrispError);
    expect((err as CrispError).code).toBe('INVALID_ARGUMENT');
    expect((err as CrispError).message).toMatch(/fma-v3/);
  });
});

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

  it('the subgroup-matrix attention kernel validates (fragment offsets subgroup-uniform)', async () => {
    expect(await errorsOf(attentionSmmProgram(128).wgsl)).toEqual([]);
    expect(await errorsOf(attentionSmmProgram(64).wgsl)).toEqual([]);
    expect(await errorsOf(attentionSmmProgram(128, true).wgsl), 'staged').toEqual([]);
    expect(await errorsOf(attentionSmmProgram(64, true).wgsl), 'staged d64').toEqual([]);
  });

  it('the Tint check can fail: offsets from local_invocation_index are rejected', async () => {
    const bad = attentionSmmProgram(128).wgsl.replace('let sg = sgid;', 'let sg = lid / 32u;');
    expect(bad).not.toBe(attentionSmmProgram(128).wgsl);
    const errs = await errorsOf(bad);
    expect(errs.join('\n')).toMatch(/uniform/);
  });

  it('the unrolled (GPU) v3 kernels validate, f16 and f32, d = 64 and 128', async () => {
    for (const dt of ['f16', 'f32'] as const) {
      for (const d of [64, 128]) expect(await errorsOf(attentionV3Program(dt, d, false).wgsl), `${dt} d${d}`).toEqual([]);
    }
  });

  it('the unrolled (GPU) v4 kernels and their experiment forms (wide: 48 KiB, GPU-only) validate, f16 and f32, d = 64 and 128', async () => {
    for (const dt of ['f16', 'f32'] as const) {
      for (const d of [64, 128]) {
        for (const o of [{}, { muladd: true }, { noPrefetch: true }, { wide: true }]) {
          expect(await errorsOf(attentionV4Program(dt, d, o).wgsl), `${dt} d${d} ${JSON.stringify(o)}`).toEqual([]);
        }
      }
    }
  });
});
