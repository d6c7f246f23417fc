/**
 * Backend creation under hostile options: every wrong type or value is INVALID_ARGUMENT
 * before any adapter or device is asked for (spies count the calls), adapters that cannot
 * serve are BACKEND_UNAVAILABLE without a device left behind, a lost device is DEVICE_LOST,
 * and a device handed in keeps working after its backend is disposed.
 */
import { hostTensor } from '@crisp/core';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createWebGpuBackend } from './backend.js';
import { createNodeWebGpuBackend, webgpuAvailability } from './node.js';
import { SUBGROUP_MATRIX_FORMS } from './kernels/attention/subgroup-matrix.js';
import { ATTENTION_KERNELS, FMA_SPARSE_CROSSOVER, H200_SPARSE_CROSSOVER, TENSOR_CORE_SPARSE_CROSSOVER } from './options.js';
import { code, settledLiveBuffers, sharedBackend } from './test-support.js';

const { backend, reason } = await sharedBackend();

/** A GPU object that counts requestAdapter calls and finds no adapter. */
function spyGpu(): { gpu: GPU; calls: () => number } {
  let n = 0;
  const gpu = {
    requestAdapter: async () => {
      n++;
      return null;
    },
  } as unknown as GPU;
  return { gpu, calls: () => n };
}

/** An adapter with these limits whose requestDevice counts calls (and returns `device`). */
function spyAdapter(limits: Record<string, number>, device: unknown = undefined): { adapter: GPUAdapter; calls: () => number } {
  let n = 0;
  const base = {
    maxStorageBufferBindingSize: 2 ** 27,
    maxBufferSize: 2 ** 28,
    maxComputeWorkgroupStorageSize: 32768,
    maxStorageBuffersPerShaderStage: 8,
    maxComputeInvocationsPerWorkgroup: 256,
    maxComputeWorkgroupSizeX: 256,
    maxComputeWorkgroupsPerDimension: 65535,
  };
  const adapter = {
    features: new Set<string>(),
    limits: { ...base, ...limits },
    info: { vendor: 'spy', architecture: '', description: '' },
    requestDevice: async () => {
      n++;
      if (device instanceof Error) throw device;
      return device;
    },
  } as unknown as GPUAdapter;
  return { adapter, calls: () => n };
}

describe('createWebGpuBackend: options checked before any device work', () => {
  const bad: [string, unknown][] = [
    ['null options', null],
    ['a number', 5],
    ['a string', 'fma'],
    ['an array', []],
    ['an unknown key (a typo)', { attentionKernal: 'fma' }],
    ['attentionKernel unknown', { attentionKernel: 'tensor' }],
    ['attentionKernel not a string', { attentionKernel: 1 }],
    ['subgroupMatrixForm unknown', { subgroupMatrixForm: 'fast' }],
    ['subgroupMatrixForm not a string', { subgroupMatrixForm: 2 }],
    ['sparseCrossover negative', { sparseCrossover: -1 }],
    ['sparseCrossover NaN', { sparseCrossover: Number.NaN }],
    ['sparseCrossover a string', { sparseCrossover: '8000' }],
    ['maxDispatchWork zero', { maxDispatchWork: 0 }],
    ['maxDispatchWork a string', { maxDispatchWork: '5' }],
    ['maxDispatchWork NaN', { maxDispatchWork: Number.NaN }],
    ['compactKernels a string', { compactKernels: 'yes' }],
    ['peCut unknown', { peCut: 'gpu' }],
    ['peCut not a string', { peCut: true }],
    ['device an empty object', { device: {} }],
    ['device a number', { device: 3 }],
    ['adapter an empty object', { adapter: {} }],
    ['gpu without requestAdapter', { gpu: { requestAdapter: 1 } }],
  ];
  for (const [what, opts] of bad) {
    it(`${what}: INVALID_ARGUMENT, no adapter requested`, async () => {
      const spy = spyGpu();
      const o = opts !== null && typeof opts === 'object' && !Array.isArray(opts) ? { gpu: spy.gpu, ...opts } : opts;
      expect(await code(createWebGpuBackend(o as never))).toBe('INVALID_ARGUMENT');
      expect(spy.calls()).toBe(0);
    });
  }

  it('device and adapter together: INVALID_ARGUMENT (one of them would be ignored)', async () => {
    const a = spyAdapter({});
    const fakeDevice = backend?.gpu.device ?? ({} as GPUDevice);
    expect(await code(createWebGpuBackend({ device: fakeDevice, adapter: a.adapter }))).toBe('INVALID_ARGUMENT');
    expect(a.calls()).toBe(0);
  });

  it('property: any option object is INVALID_ARGUMENT before requestAdapter exactly when an option is wrong', async () => {
    const known = ['sparseCrossover', 'maxDispatchWork', 'attentionKernel', 'subgroupMatrixForm', 'compactKernels', 'peCut'];
    const value = fc.oneof(
      fc.constant(undefined),
      fc.double(),
      fc.integer(),
      fc.boolean(),
      fc.string(),
      fc.constantFrom(...ATTENTION_KERNELS),
      fc.constantFrom(...SUBGROUP_MATRIX_FORMS),
      fc.constantFrom('device', 'host'),
      fc.constant(null),
      fc.object({ maxDepth: 1 }),
    );
    const key = fc.oneof(fc.constantFrom(...known), fc.string({ minLength: 1, maxLength: 8 }));
    const valid = (k: string, v: unknown): boolean => {
      if (v === undefined) return known.includes(k);
      switch (k) {
        case 'sparseCrossover':
          return typeof v === 'number' && v >= 0;
        case 'maxDispatchWork':
          return typeof v === 'number' && v > 0;
        case 'attentionKernel':
          return (ATTENTION_KERNELS as readonly unknown[]).includes(v);
        case 'subgroupMatrixForm':
          return (SUBGROUP_MATRIX_FORMS as readonly unknown[]).includes(v);
        case 'compactKernels':
          return typeof v === 'boolean';
        case 'peCut':
          return v === 'device' || v === 'host';
        default:
          return false;
      }
    };
    let tried = 0;
    await fc.assert(
      fc.asyncProperty(fc.dictionary(key, value, { maxKeys: 4 }), async (opts) => {
        tried++;
        const spy = spyGpu();
        const ok = Object.entries(opts).every(([k, v]) => valid(k, v));
        const got = await code(createWebGpuBackend({ ...opts, gpu: spy.gpu } as never));
        // valid options reach the spy, which finds no adapter
        expect(got).toBe(ok ? 'BACKEND_UNAVAILABLE' : 'INVALID_ARGUMENT');
        expect(spy.calls()).toBe(ok ? 1 : 0);
      }),
      { numRuns: 300 },
    );
    expect(tried).toBe(300);
  });
});

describe('createWebGpuBackend: adapters and devices that cannot serve', () => {
  it('requestAdapter throws: BACKEND_UNAVAILABLE with its message', async () => {
    const gpu = {
      requestAdapter: async () => {
        throw new Error('driver crashed');
      },
    } as unknown as GPU;
    const e = await createWebGpuBackend({ gpu }).catch((x: unknown) => x);
    expect((e as { code?: string }).code).toBe('BACKEND_UNAVAILABLE');
    expect(String((e as Error).message)).toContain('driver crashed');
  });

  it('too few storage buffers or too little workgroup memory: BACKEND_UNAVAILABLE naming the limit, no device requested', async () => {
    for (const [limit, value] of [
      ['maxStorageBuffersPerShaderStage', 4],
      ['maxComputeWorkgroupStorageSize', 16384],
    ] as const) {
      const a = spyAdapter({ [limit]: value });
      const e = await createWebGpuBackend({ adapter: a.adapter }).catch((x: unknown) => x);
      expect((e as { code?: string }).code, limit).toBe('BACKEND_UNAVAILABLE');
      expect((e as { details?: { limit?: string } }).details?.limit).toBe(limit);
      expect(a.calls()).toBe(0);
    }
  });

  it('requestDevice rejects or returns something that is not a device: BACKEND_UNAVAILABLE', async () => {
    const refused = spyAdapter({}, new Error('adapter is "consumed": it has already been used to create a device'));
    const e = await createWebGpuBackend({ adapter: refused.adapter }).catch((x: unknown) => x);
    expect((e as { code?: string }).code).toBe('BACKEND_UNAVAILABLE');
    expect(String((e as Error).message)).toContain('call requestAdapter() again');
    expect(await code(createWebGpuBackend({ adapter: spyAdapter({}, null).adapter }))).toBe('BACKEND_UNAVAILABLE');
    expect(await code(createWebGpuBackend({ adapter: spyAdapter({}, { createBuffer: 1 }).adapter }))).toBe('BACKEND_UNAVAILABLE');
  });
});

describe('createNodeWebGpuBackend: options checked before Dawn starts', () => {
  const bad: [string, unknown][] = [
    ['a device (this entry makes its own)', { device: {} }],
    ['an adapter', { adapter: {} }],
    ['a gpu', { gpu: {} }],
    ['flags not an array', { flags: 'enable-dawn-features=x' }],
    ['a flag without key=value', { flags: ['garbage'] }],
    ['a flag that is not a string', { flags: [1] }],
    ['an unknown key', { flag: [] }],
    ['attentionKernel unknown', { attentionKernel: 'wmma' }],
    ['dawnWait unknown', { dawnWait: 'sleep' }],
  ];
  for (const [what, opts] of bad) {
    it(`${what}: INVALID_ARGUMENT`, async () => {
      expect(await code(createNodeWebGpuBackend(opts as never))).toBe('INVALID_ARGUMENT');
    });
  }
  it('webgpuAvailability with malformed flags: INVALID_ARGUMENT', async () => {
    expect(await code(webgpuAvailability(['nonsense']))).toBe('INVALID_ARGUMENT');
  });
});

describe.skipIf(!backend)(`devices handed in${reason ? ` (skipped: ${reason})` : ''}`, () => {
  const b = backend!;
  const instance = b.gpu.keepAlive.find((x) => typeof (x as GPU | undefined)?.requestAdapter === 'function') as GPU;

  it('a lost device: DEVICE_LOST with what to do', async () => {
    const adapter = (await instance.requestAdapter())!;
    const device = await adapter.requestDevice();
    device.destroy();
    const e = await createWebGpuBackend({ device }).catch((x: unknown) => x);
    expect((e as { code?: string }).code).toBe('DEVICE_LOST');
    expect(String((e as Error).message)).toContain('request a new one');
  });

  it('an adapter already used for a device: BACKEND_UNAVAILABLE saying to request another', async () => {
    const adapter = (await instance.requestAdapter())!;
    const first = await adapter.requestDevice();
    const e = await createWebGpuBackend({ adapter }).catch((x: unknown) => x);
    first.destroy();
    expect((e as { code?: string }).code).toBe('BACKEND_UNAVAILABLE');
    expect(String((e as Error).message)).toContain('requestAdapter() again');
  });

  it('dispose() frees what the backend made on a device handed in, and leaves the device working', async () => {
    const before = await settledLiveBuffers(b);
    const other = await createWebGpuBackend({ device: b.gpu.device });
    const t = other.upload(hostTensor('f32', [64, 4], new Float32Array(256).fill(1)));
    other.allocate('f16', [32, 8]);
    expect(other.gpu.liveBuffers.buffers).toBe(2);
    other.dispose();
    await b.synchronize();
    await new Promise((r) => setTimeout(r, 10));
    expect(other.gpu.liveBuffers.buffers).toBe(0);
    expect(await code(other.download(t))).toBe('DISPOSED');
    expect(b.gpu.liveBuffers.buffers).toBe(before);
    const x = b.upload(hostTensor('f32', [4], [1, 2, 3, 4]));
    expect(Array.from((await b.download(x)).data)).toEqual([1, 2, 3, 4]);
    x.dispose();
  });
});

describe.skipIf(!backend)(`the length gate follows the kernel in use${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it("the tensor-core kernel's gate while it is in use, the FMA kernel's otherwise, and an option over both", async () => {
    const b = backend!;
    const other = await createWebGpuBackend({ device: b.gpu.device, sparseCrossover: 12345 });
    const was = b.gpu.subgroupMatrix;
    try {
      b.gpu.subgroupMatrix = false;
      expect(b.sparseCrossover).toBe(FMA_SPARSE_CROSSOVER);
      expect(b.sparseCrossoverFor('f16', 128)).toBe(FMA_SPARSE_CROSSOVER);
      b.gpu.subgroupMatrix = true;
      expect(b.sparseCrossover).toBe(TENSOR_CORE_SPARSE_CROSSOVER);
      // per call: the kernel that dtype and head dim run
      expect(b.sparseCrossoverFor('f16', 128)).toBe(TENSOR_CORE_SPARSE_CROSSOVER);
      expect(b.sparseCrossoverFor('f16', 64)).toBe(TENSOR_CORE_SPARSE_CROSSOVER);
      expect(b.sparseCrossoverFor('f32', 128)).toBe(FMA_SPARSE_CROSSOVER);
      expect(b.sparseCrossoverFor('f16', 96)).toBe(FMA_SPARSE_CROSSOVER);
      // (two gates, so the lines above tell the kernels apart)
      expect(TENSOR_CORE_SPARSE_CROSSOVER).not.toBe(FMA_SPARSE_CROSSOVER);
      // the old name still answers
      expect(H200_SPARSE_CROSSOVER).toBe(FMA_SPARSE_CROSSOVER);
      other.gpu.subgroupMatrix = true;
      expect(other.sparseCrossover).toBe(12345);
      expect(other.sparseCrossoverFor('f16', 128)).toBe(12345);
      expect(other.sparseCrossoverFor('f32', 64)).toBe(12345);
    } finally {
      b.gpu.subgroupMatrix = was;
      other.dispose();
    }
  });
});
