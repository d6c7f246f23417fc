/**
 * Test helpers (not exported from the package entry): one shared Node backend per test
 * file, or the reason it is unavailable.
 */
import { createNodeWebGpuBackend, webgpuAvailability } from './node.js';
import { collectionReported, defaultPolicies, garbageCollector } from '@crisp/conformance';
import { isCrispError, mulberry32, type Policy } from '@crisp/core';
import type { WebGpuBackend } from './backend.js';
import { WRAPPED_DEVICE } from './runtime/gpu-context.js';

let cached: Promise<{ backend?: WebGpuBackend; reason?: string }> | undefined;

export function sharedBackend(): Promise<{ backend?: WebGpuBackend; reason?: string }> {
  cached ??= (async () => {
    const a = await webgpuAvailability();
    if (!a.available) {
      console.warn(`[kernels-webgpu] skipping WebGPU tests: ${a.reason}`);
      return { reason: a.reason };
    }
    return { backend: await createNodeWebGpuBackend() };
  })();
  return cached;
}

/**
 * The conformance suites' policies: the default ones, the scaled copies first. The lifetime
 * case (eight prefills in one job, checking only that their statistics are collected) takes
 * the first policy that routes, and the scaled crisp's sparse plans cost a fraction of the
 * shipped crisp's nearly dense ones at n = 1100 on a CPU adapter. Every pipeline case still runs.
 */
export function conformancePolicies(): Policy[] {
  const [crispShipped, flexShipped, ...scaled] = defaultPolicies();
  return [...scaled, crispShipped, flexShipped];
}

/**
 * The policies of the n = 2100 pipeline cases (conformance-long.test.ts): the scaled copies
 * only (B = 64, kMin 256: crisp, flexPrefill, crispGuarded). At that length the shipped
 * presets (B = 128, kMin 1024) plan nearly every block, so their two cases ran the dense
 * kernels again through the pipeline at twice a sparse case's cost (about 24 s of CPU on
 * SwiftShader); they keep their whole and chunked pipeline cases at n = 1100 in
 * conformance.test.ts.
 */
export function longPipelinePolicies(): Policy[] {
  return defaultPolicies().slice(2);
}

/**
 * The policies of the varlen cases (conformance-varlen.test.ts): the scaled copies and the
 * shipped crisp, whose B = 128 is the varlen pipeline's other block size. The shipped
 * flexPrefill differs from the shipped crisp there only in its router and selector, which
 * the scaled flexPrefill runs through the same varlen pipeline; its two cases (about 15 s of
 * CPU, nearly dense) are left out.
 */
export function varlenPolicies(): Policy[] {
  const [crispShipped, , ...scaled] = defaultPolicies();
  return [...scaled, crispShipped];
}

/**
 * The conformance suite's longest cases on this backend: whole pipelines at n = 2100 with a
 * chunk of 1100 queries. They run in the package's second test process
 * (conformance-long.test.ts), which compiles the same default kernels for the varlen cases.
 */
export const LONG_PIPELINE = /^pipeline\/[^/]+\/n2100-/;

/** Seeded uniform values in [-1, 1) (mulberry32). */
export function seededValues(seed: number, count: number, amp = 1): Float32Array {
  const r = mulberry32(seed);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = (r() * 2 - 1) * amp;
  return out;
}

export function freshSeed(): number {
  return Number(process.env.CRISP_SEED ?? Math.floor(Math.random() * 2 ** 31));
}

/**
 * The buffers `be` holds once what earlier tests dropped has gone back: the backend is shared
 * by every file of this process, and statistics or prepared masks that a test let go of are
 * retired by their finalizer whenever V8 collects them, which under load can fall in the middle
 * of another test's before/after count. So: a full collection, a wait until a registry of our
 * own has reported it (collectionReported; registries report in tasks queued together, and two
 * more timer turns cover the backend's), then a synchronize, which gives the retired buffers
 * back. Take a baseline with this and read the count after the calls under
 * test without it: a buffer those calls leave for the collector still counts against them.
 */
export async function settledLiveBuffers(be: WebGpuBackend): Promise<number> {
  const gc = await garbageCollector();
  if (!gc) throw new Error('no garbage collection on demand in this runtime (Node has one)');
  await new Promise((r) => setTimeout(r, 0));
  let reported = false;
  const registry = new FinalizationRegistry(() => {
    reported = true;
  });
  if (!(await collectionReported(gc, registry, () => reported))) throw new Error('a full collection was not reported within a minute');
  for (let i = 0; i < 2; i++) await new Promise((r) => setTimeout(r, 0));
  await be.synchronize();
  return be.gpu.liveBuffers.buffers;
}

/** The CrispError code a call ends with (undefined when it succeeds); a non-CrispError is reported as such. */
export async function code(p: Promise<unknown> | (() => unknown)): Promise<string | undefined> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    return isCrispError(e) ? e.code : `not a CrispError: ${String(e)}`;
  }
  return undefined;
}

/** `p`, or a rejection naming `what` after `ms` (a hang becomes a failed test, not a stuck run). */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer after ${ms} ms (hang)`)), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

/** What a faulty device does to the calls that reach it. */
export interface Faults {
  /** make this buffer an out-of-memory failure (as Dawn does: an error buffer, the error in the innermost out-of-memory scope) */
  oom?: (desc: GPUBufferDescriptor) => boolean;
  /** make this bind group invalid (one entry dropped): a validation failure of the dispatch, as a launch failure */
  badBindGroup?: () => boolean;
  /** how many faults were injected */
  injected: number;
  /** the labels of the compute pipelines created through the device, in order */
  pipelines?: string[];
}

class GPUOutOfMemoryError {
  readonly message: string;
  constructor(message: string) {
    this.message = message;
  }
}

/**
 * A real device seen through a proxy that injects faults: out-of-memory buffers (a real error
 * buffer, so later use of it fails in Dawn as it would) and invalid bind groups. Everything
 * else goes to the real device.
 */
export function faultyDevice(real: GPUDevice, faults: Faults): GPUDevice {
  const scopes: { filter: GPUErrorFilter; hit: boolean }[] = [];
  const hitScopes = () => {
    faults.injected++;
    for (let i = scopes.length - 1; i >= 0; i--) {
      if (scopes[i].filter === 'out-of-memory') {
        scopes[i].hit = true;
        break;
      }
    }
    // (the consequences Dawn reports in validation scopes are swallowed where the fault lands)
    for (const s of scopes) if (s.filter === 'validation') s.hit = true;
  };
  return new Proxy(real, {
    get(target, prop) {
      // its pipelines are the real device's (compiled once for both)
      if (prop === WRAPPED_DEVICE) return target;
      if (prop === 'pushErrorScope') {
        return (filter: GPUErrorFilter) => {
          scopes.push({ filter, hit: false });
          target.pushErrorScope(filter);
        };
      }
      if (prop === 'popErrorScope') {
        return async () => {
          const s = scopes.pop();
          const r = await target.popErrorScope();
          if (s?.hit) return s.filter === 'out-of-memory' ? new GPUOutOfMemoryError('injected: out of memory') : null;
          return r;
        };
      }
      if (prop === 'createBuffer') {
        return (desc: GPUBufferDescriptor) => {
          if (faults.oom?.(desc)) {
            hitScopes();
            return target.createBuffer({ ...desc, size: Number(target.limits.maxBufferSize) + 16 });
          }
          return target.createBuffer(desc);
        };
      }
      if (prop === 'createBindGroup') {
        return (desc: GPUBindGroupDescriptor) => {
          if (faults.badBindGroup?.()) {
            faults.injected++;
            return target.createBindGroup({ ...desc, entries: [...desc.entries].slice(1) });
          }
          return target.createBindGroup(desc);
        };
      }
      if (prop === 'createComputePipeline' || prop === 'createComputePipelineAsync') {
        const create = Reflect.get(target, prop) as (desc: GPUComputePipelineDescriptor) => unknown;
        return (desc: GPUComputePipelineDescriptor) => {
          faults.pipelines ??= [];
          faults.pipelines.push(desc.label ?? '');
          return create.call(target, desc);
        };
      }
      const v = Reflect.get(target, prop);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}
