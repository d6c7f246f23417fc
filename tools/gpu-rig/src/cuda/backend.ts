/** The CUDA backend every phase runs on, created from the flags, and a device-timed repeat helper. */
import { type CudaBackend, createCudaBackend } from '@crisp/kernels-cuda';
import { pdlArg, proxyLayoutArg, variantArg } from './args.js';
import { log, results } from './harness.js';

if (pdlArg !== 'on' && pdlArg !== 'off') throw new Error(`--pdl must be on or off; got ${pdlArg}`);
export const be: CudaBackend = await createCudaBackend({
  kernelDir: 'packages/kernels-cuda/kernels',
  cacheDir: '/tmp/crisp-cubin',
  ...(variantArg ? { attentionVariant: variantArg } : {}),
  ...(proxyLayoutArg ? { proxyLayout: proxyLayoutArg } : {}),
  programmaticLaunch: pdlArg === 'on',
});
log(`programmatic launches: ${be.programmaticLaunch ? 'on' : 'off'}${pdlArg === 'on' && !be.programmaticLaunch ? ' (the GPU or driver lacks them)' : ''}`);
/** the backend's proxy layout (the GPU's default unless --proxyLayout) */
export const proxyLayout = be.proxyLayout;
export const variant = be.attentionVariant;
results.variant = variant;
results.proxyLayout = proxyLayout;
results.device = be.info;
log(`device ${be.info.name} cc ${be.info.computeCapability.join('.')} driver ${be.info.driverVersion}`);

export async function timeIt(fn: () => Promise<unknown>, n: number, warm = 1): Promise<number[]> {
  for (let i = 0; i < warm; i++) await be.timeMs(fn);
  const t: number[] = [];
  for (let i = 0; i < n; i++) t.push(await be.timeMs(fn));
  return t;
}
