import { describe, expect, it } from 'vitest';
import { createNodeWebGpuBackend, webgpuAvailability } from './node.js';
import { dawnWaitsYield, isCpuAdapter, yieldDawnWaits } from './runtime/dawn-wait.js';

/** a native function, as dawn.node's tick is (a bound function prints as native code) */
const nativeLike = (f: () => void) => f.bind(null);
const nextImmediate = () => new Promise<void>((resolve) => setImmediate(resolve));
const fakeAdapter = (info: Partial<GPUAdapterInfo>, fallback = false) =>
  ({ info: { vendor: '', architecture: '', device: '', description: '', ...info }, isFallbackAdapter: fallback }) as unknown as GPUAdapter;

describe('Dawn waits', () => {
  it('tells CPU adapters from GPUs by their info', () => {
    expect(isCpuAdapter(fakeAdapter({ vendor: 'google', architecture: 'swiftshader', description: 'SwiftShader driver 5.0.0' }))).toBe(true);
    expect(isCpuAdapter(fakeAdapter({ vendor: 'mesa', description: 'llvmpipe (LLVM 15.0.6, 256 bits)' }))).toBe(true);
    expect(isCpuAdapter(fakeAdapter({ vendor: 'anything' }, true))).toBe(true);
    expect(isCpuAdapter(fakeAdapter({ vendor: 'nvidia', architecture: 'hopper', description: 'NVIDIA H100 80GB HBM3' }))).toBe(false);
  });

  it('once yielded, a native callback of setImmediate runs from a timer, a JavaScript one as before', async () => {
    yieldDawnWaits();
    yieldDawnWaits(); // a second call wraps nothing twice
    expect(dawnWaitsYield()).toBe(true);
    // a native callback goes to a 1 ms timer; a JavaScript one stays an immediate
    let nativeRan = false;
    const t = setImmediate(nativeLike(() => (nativeRan = true))) as unknown as { constructor: { name: string } };
    expect(t.constructor.name).toBe('Timeout');
    const i = setImmediate(() => {}) as unknown as { constructor: { name: string } };
    expect(i.constructor.name).toBe('Immediate');
    await new Promise((r) => setTimeout(r, 20));
    expect(nativeRan).toBe(true);
    // arguments still reach a JavaScript callback; clearImmediate still cancels one
    const got = await new Promise<number>((resolve) => setImmediate((x: number) => resolve(x), 7));
    expect(got).toBe(7);
    let ran = false;
    clearImmediate(setImmediate(() => (ran = true)) as NodeJS.Immediate);
    await nextImmediate();
    expect(ran).toBe(false);
  });
});

const availability = await webgpuAvailability();
describe.skipIf(!availability.available)(`on this adapter (${availability.adapter?.description ?? availability.reason})`, () => {
  // (every WebGPU suite of this package runs with the default, so their answers are checked
  // with the ticks yielded on SwiftShader)
  it('the default (auto) yields on a CPU adapter', async () => {
    const backend = await createNodeWebGpuBackend();
    if (isCpuAdapter(fakeAdapter(availability.adapter ?? {}))) expect(dawnWaitsYield()).toBe(true);
    await backend.synchronize();
    backend.dispose();
  });
});
