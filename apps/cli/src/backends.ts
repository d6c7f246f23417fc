/**
 * Backend selection: `auto` takes CUDA, then a hardware WebGPU adapter, then the reference.
 * A software WebGPU adapter (SwiftShader, llvmpipe) is skipped by `auto`: it is slower than
 * the reference on the same CPU. `--backend <name>` asks for one and fails (exit 1, with the
 * reason) when it is not there.
 */
import { type Backend, CrispError, type DType } from '@crisp/core';
import { createReferenceBackend } from '@crisp/reference';

export type BackendChoice = 'auto' | 'cuda' | 'webgpu' | 'reference';
export const BACKEND_CHOICES: readonly BackendChoice[] = ['auto', 'cuda', 'webgpu', 'reference'];

export interface SelectedBackend {
  readonly backend: Backend;
  readonly name: 'cuda' | 'webgpu' | 'reference';
  /** what was tried and why it was passed over */
  readonly notes: readonly string[];
  /** dtype the default scenario uses here */
  readonly dtype: DType;
  /** default problem size for this backend */
  readonly defaults: { readonly n: number; readonly heads: number; readonly kvHeads: number; readonly headDim: number };
  /**
   * Where the backend reports how far one attention call has got (the reference backend
   * does; GPU calls are short): set `listener` around a call, clear it after.
   */
  readonly attentionProgress?: { listener?: (done: number, total: number) => void };
}

const SOFTWARE_ADAPTER = /swiftshader|llvmpipe|software|cpu/i;

async function tryCuda(): Promise<Backend | string> {
  try {
    const m = await import('@crisp/kernels-cuda');
    const a = m.cudaAvailability();
    if (!a.available) return `CUDA: ${a.reason ?? 'not available'}`;
    return await m.createCudaBackend();
  } catch (e) {
    return `CUDA: ${e instanceof Error ? e.message : String(e)}`;
  }
}

async function tryWebGpu(allowSoftware: boolean): Promise<Backend | string> {
  try {
    const m = await import('@crisp/kernels-webgpu/node');
    const a = await m.webgpuAvailability();
    if (!a.available) return `WebGPU: ${a.reason ?? 'no adapter'}`;
    const desc = `${a.adapter?.vendor ?? ''} ${a.adapter?.architecture ?? ''} ${a.adapter?.description ?? ''}`;
    if (!allowSoftware && SOFTWARE_ADAPTER.test(desc)) {
      return `WebGPU: only a software adapter (${desc.trim()}); pass --backend webgpu to use it anyway`;
    }
    return await m.createNodeWebGpuBackend();
  } catch (e) {
    return `WebGPU: ${e instanceof Error ? e.message : String(e)}`;
  }
}

export async function selectBackend(choice: BackendChoice): Promise<SelectedBackend> {
  const notes: string[] = [];
  if (choice === 'auto' || choice === 'cuda') {
    const r = await tryCuda();
    if (typeof r !== 'string') {
      return {
        backend: r,
        name: 'cuda',
        notes,
        dtype: 'bf16',
        defaults: { n: 65536, heads: 32, kvHeads: 8, headDim: 128 },
      };
    }
    if (choice === 'cuda') throw new CrispError('BACKEND_UNAVAILABLE', `${r}; use --backend auto or reference`);
    notes.push(r);
  }
  if (choice === 'auto' || choice === 'webgpu') {
    const r = await tryWebGpu(choice === 'webgpu');
    if (typeof r !== 'string') {
      const f16 = r.capabilities.dtypes.includes('f16');
      const software = choice === 'webgpu' ? await isSoftware() : false;
      return {
        backend: r,
        name: 'webgpu',
        notes,
        dtype: f16 ? 'f16' : 'f32',
        defaults: software
          ? { n: 4096, heads: 8, kvHeads: 2, headDim: 64 }
          : { n: 32768, heads: 32, kvHeads: 8, headDim: 128 },
      };
    }
    if (choice === 'webgpu') throw new CrispError('BACKEND_UNAVAILABLE', `${r}; use --backend auto or reference`);
    notes.push(r);
  }
  const attentionProgress: NonNullable<SelectedBackend['attentionProgress']> = {};
  return {
    backend: createReferenceBackend({ onProgress: (p) => attentionProgress.listener?.(p.done, p.total) }),
    name: 'reference',
    notes,
    attentionProgress,
    dtype: 'f32',
    // Measured: prints its summary in well under a minute on a 2-core CPU (apps/cli/README.md).
    defaults: { n: 4096, heads: 8, kvHeads: 2, headDim: 64 },
  };
}

async function isSoftware(): Promise<boolean> {
  try {
    const m = await import('@crisp/kernels-webgpu/node');
    const a = await m.webgpuAvailability();
    return SOFTWARE_ADAPTER.test(`${a.adapter?.vendor ?? ''} ${a.adapter?.architecture ?? ''} ${a.adapter?.description ?? ''}`);
  } catch {
    return false;
  }
}
