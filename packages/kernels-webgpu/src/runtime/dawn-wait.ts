/**
 * How Dawn in Node waits for the GPU. While any of its asynchronous operations is pending
 * (mapAsync, onSubmittedWorkDone, popErrorScope, ...), dawn.node polls for completion by
 * queueing a native tick with `setImmediate`, which queues the next one: the main thread spins
 * at 100% of a core for as long as the GPU works. On a GPU that costs a CPU core per waiting
 * process and buys the lowest completion latency. On a CPU adapter (SwiftShader) the GPU *is*
 * the CPU: the spin takes a core from the workers that run the shaders. Measured on 2 cores,
 * 20 dispatches of 32 workgroups: 12.4 s wall and 24.6 s of CPU spinning, 8.1 s and 15.9 s
 * with the ticks yielded.
 *
 * `yieldDawnWaits()` wraps the global `setImmediate` so that a native callback (dawn.node's
 * tick; JavaScript callbacks pass through untouched) runs from a 1 ms timer instead: Dawn then
 * checks for completion about a thousand times a second and the core is free in between. The
 * wrap is process-wide (every Dawn instance of the process polls through it) and stays for the
 * life of the process; calling it again does nothing.
 */

/** `auto`: yield on a CPU adapter (SwiftShader and the like), spin on a GPU. */
export type DawnWait = 'auto' | 'spin' | 'yield';

export const DAWN_WAITS: readonly DawnWait[] = ['auto', 'spin', 'yield'];

const WRAPPED = Symbol.for('@crisp/kernels-webgpu.dawnTickYield');

type Immediate = (cb: (...args: unknown[]) => void, ...args: unknown[]) => unknown;

/** V8 prints a native function as `function name() { [native code] }`; only its end is read. */
function isNative(f: unknown): boolean {
  return typeof f === 'function' && Function.prototype.toString.call(f).endsWith('{ [native code] }');
}

/** Whether the global setImmediate yields dawn.node's ticks (yieldDawnWaits ran). */
export function dawnWaitsYield(): boolean {
  return (globalThis.setImmediate as unknown as { [WRAPPED]?: boolean })[WRAPPED] === true;
}

/** Dawn's polling ticks from a 1 ms timer instead of back to back (see the module's notes). */
export function yieldDawnWaits(): void {
  if (dawnWaitsYield()) return;
  const original = globalThis.setImmediate as unknown as Immediate;
  const wrapped = function setImmediate(cb: (...args: unknown[]) => void, ...args: unknown[]) {
    if (isNative(cb)) return setTimeout(cb, 1, ...args);
    return original(cb, ...args);
  };
  Object.defineProperty(wrapped, WRAPPED, { value: true });
  // (keeps setImmediate.__promisify__ and the like reachable)
  Object.setPrototypeOf(wrapped, original);
  globalThis.setImmediate = wrapped as unknown as typeof globalThis.setImmediate;
}

/** An adapter whose "GPU" runs on the CPU: SwiftShader, llvmpipe/lavapipe, a fallback adapter. */
export function isCpuAdapter(adapter: GPUAdapter): boolean {
  const info = adapter.info;
  const text = `${info.vendor} ${info.architecture} ${info.device} ${info.description}`.toLowerCase();
  return (adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter === true || /swiftshader|llvmpipe|lavapipe/.test(text);
}

/** Applies `wait` for `adapter`: `yield`, or `auto` on a CPU adapter, yields Dawn's ticks. */
export function applyDawnWait(wait: DawnWait, adapter: GPUAdapter): void {
  if (wait === 'yield' || (wait === 'auto' && isCpuAdapter(adapter))) yieldDawnWaits();
}
