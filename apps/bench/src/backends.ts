/**
 * Open the backends a run asks for (or every one this machine has). A backend that is not
 * here is a result ("unavailable: why"), never a crash.
 */
import { join } from 'node:path';
import type { Backend } from '@crisp/core';
import { type AttentionVariant, type CudaSchedule, cudaAvailability, createCudaBackend, type ProxyLayout } from '@crisp/kernels-cuda';
import { createNodeWebGpuBackend, webgpuAvailability } from '@crisp/kernels-webgpu/node';
import { createReferenceBackend } from '@crisp/reference';
import type { BackendName, BenchConfig } from './config.js';

export interface OpenBackend {
  readonly name: BackendName;
  readonly backend?: Backend;
  readonly reason?: string;
  /** adapter / device description, when there is one */
  readonly device?: string;
  /** the length gate the backend ships with (its `sparseCrossover`) */
  readonly shippedCrossover?: number;
}

export async function openBackend(
  name: BackendName,
  repoRoot: string | undefined,
  opts: {
    readonly cudaSchedule?: CudaSchedule;
    readonly proxyLayout?: ProxyLayout;
    readonly programmaticLaunch?: boolean;
    readonly flexPrefillOnDevice?: boolean;
    readonly peVsExcessOnDevice?: boolean;
    readonly attentionVariant?: AttentionVariant;
    readonly webgpuKernel?: BenchConfig['webgpuKernel'];
    readonly webgpuPeCut?: BenchConfig['webgpuPeCut'];
  } = {},
): Promise<OpenBackend> {
  try {
    if (name === 'reference') {
      const backend = createReferenceBackend();
      return { name, backend, device: 'float64 TypeScript (host CPU)', shippedCrossover: backend.sparseCrossover };
    }
    if (name === 'webgpu') {
      const a = await webgpuAvailability();
      if (!a.available) return { name, reason: a.reason ?? 'no WebGPU adapter' };
      const wk = opts.webgpuKernel;
      const backend = await createNodeWebGpuBackend({
        ...(wk ? { attentionKernel: wk.kernel, ...(wk.form ? { subgroupMatrixForm: wk.form } : {}) } : {}),
        ...(opts.webgpuPeCut ? { peCut: opts.webgpuPeCut } : {}),
      });
      const d = a.adapter;
      // the kernel f16 attention runs (the tensor-core one where asked for and eligible)
      const kernel = backend.subgroupMatrixForm ? `subgroup-matrix:${backend.subgroupMatrixForm}` : backend.attentionKernel;
      // and the score tiles of the proxy statistics' passes over every key (the same choice)
      const stats = backend.statisticsKernelFor('f16', 128);
      return {
        name,
        backend,
        device: `${d ? `${`${d.vendor} ${d.architecture} ${d.description}`.trim()}, ` : ''}attention kernel ${kernel}, proxy statistics ${stats}${opts.webgpuPeCut === 'host' ? ', PE cut on the host' : ''}`,
        shippedCrossover: backend.sparseCrossover,
      };
    }
    const a = cudaAvailability();
    if (!a.available) return { name, reason: a.reason ?? 'no CUDA driver' };
    // From a checkout, compile the repository's kernels/ (resolved from the repo root, i.e.
    // from where the command runs): an edited kernel is benchmarked as it stands, without
    // regenerating the copy embedded in the build (which the backend uses otherwise).
    const schedule = opts.cudaSchedule ?? 'auto';
    const backend = await createCudaBackend({
      ...(repoRoot ? { kernelDir: join(repoRoot, 'packages/kernels-cuda/kernels') } : {}),
      schedule,
      ...(opts.proxyLayout ? { proxyLayout: opts.proxyLayout } : {}),
      ...(opts.programmaticLaunch === undefined ? {} : { programmaticLaunch: opts.programmaticLaunch }),
      ...(opts.flexPrefillOnDevice === undefined ? {} : { flexPrefillOnDevice: opts.flexPrefillOnDevice }),
      ...(opts.peVsExcessOnDevice === undefined ? {} : { peVsExcessOnDevice: opts.peVsExcessOnDevice }),
      ...(opts.attentionVariant ? { attentionVariant: opts.attentionVariant } : {}),
    });
    const info = (backend as { info?: { name?: string; driverVersion?: number } }).info;
    const pdl = (backend as { programmaticLaunch?: boolean }).programmaticLaunch;
    // (the host thread's wait named when it is not the driver's own, the proxy layout when
    // asked for, the programmatic launches when off)
    const notes = `${schedule === 'auto' ? '' : `; host thread waits: ${schedule}`}${opts.proxyLayout ? `; proxy layout ${opts.proxyLayout}` : ''}${pdl === false ? '; no programmatic launches' : ''}${opts.flexPrefillOnDevice === false ? "; flexPrefill's plan on the host" : ''}${opts.peVsExcessOnDevice ? "; crispGuarded's plan on the device" : ''}; attention kernel ${backend.attentionVariant}${backend.attentionVariantFallback ? ` (${backend.attentionVariantFallback})` : ''}`;
    return {
      name,
      backend,
      device: info ? `${info.name ?? ''} (driver API ${info.driverVersion ?? '?'}${notes})` : undefined,
      shippedCrossover: backend.sparseCrossover,
    };
  } catch (e) {
    return { name, reason: e instanceof Error ? e.message : String(e) };
  }
}
