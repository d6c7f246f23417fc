/**
 * Stream a scenario onto a backend in row chunks: `allocate` once, then `write` each chunk at
 * its flat offset, so n = 512k never needs a multi-gigabyte JS array (one chunk of q is
 * chunkRows·H·d values).
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d].
 */
import { type Backend, type DeviceTensor, InvalidArgumentError } from '@crisp/core';
import type { Scenario, ScenarioChunk } from './scenario.js';

export interface UploadOptions {
  /** rows per chunk (default: about 4M q values per chunk, at least 1) */
  readonly chunkRows?: number;
  /** called after each chunk with the rows written so far */
  readonly onProgress?: (rowsDone: number, n: number) => void;
  /** called with each generated chunk (rows [start, start + chunk rows)), e.g. to keep a host copy */
  readonly onChunk?: (start: number, chunk: ScenarioChunk) => void;
}

export interface ScenarioTensors {
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
  /** where the time went, ms: generating the rows, and backend.write (upload) */
  readonly timing?: { readonly generateMs: number; readonly writeMs: number };
}

/** Allocates q [n, H, d], k and v [n, Hkv, d] on the backend, each pushed to `made` (for freeing on failure). */
export function allocateQkv(backend: Backend, sc: Pick<Scenario, 'n' | 'heads' | 'kvHeads' | 'headDim' | 'dtype'>, made: DeviceTensor[]): ScenarioTensors {
  const { n, heads: H, kvHeads: Hkv, headDim: d, dtype } = sc;
  const q = backend.allocate(dtype, [n, H, d]);
  made.push(q);
  const k = backend.allocate(dtype, [n, Hkv, d]);
  made.push(k);
  const v = backend.allocate(dtype, [n, Hkv, d]);
  made.push(v);
  return { q, k, v };
}

/** Default chunk: ~4M q values (16 MB of f32), whatever the shape. */
export function defaultChunkRows(sc: Pick<Scenario, 'heads' | 'headDim' | 'n'>): number {
  return Math.max(1, Math.min(sc.n, Math.floor((4 * 1024 * 1024) / (sc.heads * sc.headDim))));
}

/**
 * Allocate q, k, v on the backend and fill them chunk by chunk. Yields to the event loop
 * between chunks so progress bars can draw. On failure the tensors are freed.
 */
export async function uploadScenario(backend: Backend, sc: Scenario, opts: UploadOptions = {}): Promise<ScenarioTensors> {
  const rows = opts.chunkRows ?? defaultChunkRows(sc);
  if (!Number.isInteger(rows) || rows < 1) {
    throw new InvalidArgumentError(`chunkRows must be a positive integer; got ${String(rows)}`);
  }
  const { n, heads: H, kvHeads: Hkv, headDim: d } = sc;
  const made: DeviceTensor[] = [];
  let generateMs = 0;
  let writeMs = 0;
  try {
    const { q, k, v } = allocateQkv(backend, sc, made);
    for (let start = 0; start < n; start += rows) {
      const end = Math.min(n, start + rows);
      const t0 = performance.now();
      const c = sc.rows(start, end);
      const t1 = performance.now();
      backend.write(q, start * H * d, c.q.data);
      backend.write(k, start * Hkv * d, c.k.data);
      backend.write(v, start * Hkv * d, c.v.data);
      generateMs += t1 - t0;
      writeMs += performance.now() - t1;
      opts.onChunk?.(start, c);
      opts.onProgress?.(end, n);
      if (end < n) await yieldToEventLoop();
    }
    return { q, k, v, timing: { generateMs, writeMs } };
  } catch (e) {
    for (const t of made) t.dispose();
    throw e;
  }
}

/** Let timers, I/O and progress output run between chunks: setImmediate in Node, a zero timeout in browsers. */
function yieldToEventLoop(): Promise<void> {
  const g = globalThis as { setImmediate?: (cb: () => void) => unknown };
  return new Promise<void>((resolve) => (g.setImmediate ? g.setImmediate(resolve) : setTimeout(resolve, 0)));
}
