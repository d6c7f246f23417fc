/**
 * A scenario generated in worker threads and streamed onto a backend (Node only: import it
 * from '@crisp/synth/node'). The rows of a scenario depend only on (profile, options, row),
 * never on chunking, so each worker builds the same scenario and generates the chunks it is
 * handed; the main thread writes them at their offsets. 512k x 32 heads takes 80-120 s on one
 * thread of the H200 host; 16 threads make it a few seconds plus the scenario's set-up.
 *
 * The workers run an entry file of the caller's (the bench's bundle, the crisp command's
 * entry), which calls `serveSynthChunks()` first: in a worker started here it serves chunks
 * and the rest of the entry does not run.
 */
import { availableParallelism } from 'node:os';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import type { Backend, DeviceTensor, DType } from '@crisp/core';
import type { ProfileName } from './profiles.js';
import { scenario } from './scenario.js';
import { allocateQkv, defaultChunkRows, type ScenarioTensors } from './upload.js';

/** What a worker needs to build the same scenario as every other. */
export interface SynthSpec {
  readonly profile: ProfileName;
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly seed: number;
  readonly dtype: DType;
}

const FLAG = 'crispSynthWorker';

interface Chunk {
  readonly start: number;
  readonly end: number;
  readonly q: Float32Array | Uint16Array;
  readonly k: Float32Array | Uint16Array;
  readonly v: Float32Array | Uint16Array;
}

/**
 * Call first in the entry: true in a worker thread started by uploadScenarioParallel (it then
 * serves chunks until told to stop; the caller should do nothing else), false elsewhere.
 */
export function serveSynthChunks(): boolean {
  if (isMainThread || !parentPort || (workerData as Record<string, unknown> | null)?.[FLAG] !== true) return false;
  const port = parentPort;
  const s = (workerData as { spec: SynthSpec }).spec;
  const sc = scenario(s.profile, { n: s.n, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, seed: s.seed, dtype: s.dtype });
  port.on('message', (m: { start: number; end: number } | 'stop') => {
    if (m === 'stop') {
      port.close();
      return;
    }
    const c = sc.rows(m.start, m.end);
    const q = c.q.data as Float32Array | Uint16Array;
    const k = c.k.data as Float32Array | Uint16Array;
    const v = c.v.data as Float32Array | Uint16Array;
    const chunk: Chunk = { start: m.start, end: m.end, q, k, v };
    port.postMessage(chunk, [q.buffer as ArrayBuffer, k.buffer as ArrayBuffer, v.buffer as ArrayBuffer]);
  });
  return true;
}

let entry: URL | undefined;

/** The entry file workers run (it must call serveSynthChunks first); unset: no workers. */
export function setSynthWorkerEntry(url: URL | undefined): void {
  entry = url;
}

export function synthWorkerEntry(): URL | undefined {
  return entry;
}

/** Threads for the generation: the host's cores less one for the main thread, at most 16. */
export function synthThreads(): number {
  return Math.max(1, Math.min(16, availableParallelism() - 1));
}

/**
 * Allocate q, k, v on the backend and fill them from `threads` workers running `workerUrl`.
 * Same values as uploadScenario (the rows do not depend on the chunking). Rejects if a worker
 * fails (the tensors are freed first); the caller may then generate on its own thread.
 * `timing.writeMs` is the main thread's time in backend.write; `generateMs` the rest of the
 * wall time (waiting for the workers).
 */
export async function uploadScenarioParallel(
  b: Backend,
  spec: SynthSpec,
  opts: { readonly threads: number; readonly workerUrl: URL; readonly chunkRows?: number; readonly onProgress?: (rowsDone: number, n: number) => void },
): Promise<ScenarioTensors> {
  const { n, heads: H, kvHeads: Hkv, headDim: d, dtype } = spec;
  const rows = opts.chunkRows ?? defaultChunkRows({ n, heads: H, headDim: d });
  const chunks: [number, number][] = [];
  for (let s = 0; s < n; s += rows) chunks.push([s, Math.min(n, s + rows)]);
  const made: DeviceTensor[] = [];
  const workers: Worker[] = [];
  const t0 = performance.now();
  let writeMs = 0;
  try {
    const { q, k, v } = allocateQkv(b, { n, heads: H, kvHeads: Hkv, headDim: d, dtype }, made);
    await new Promise<void>((resolve, reject) => {
      let next = 0;
      let written = 0;
      let rowsDone = 0;
      let failed = false;
      const fail = (e: unknown) => {
        if (failed) return;
        failed = true;
        reject(e instanceof Error ? e : new Error(String(e)));
      };
      const hand = (w: Worker) => {
        if (next < chunks.length) {
          const [start, end] = chunks[next++];
          w.postMessage({ start, end });
        } else w.postMessage('stop');
      };
      const threads = Math.max(1, Math.min(Math.floor(opts.threads), chunks.length));
      for (let i = 0; i < threads; i++) {
        const w = new Worker(opts.workerUrl, { workerData: { [FLAG]: true, spec } });
        workers.push(w);
        w.on('message', (c: Chunk) => {
          if (failed) return;
          const w0 = performance.now();
          try {
            b.write(q, c.start * H * d, c.q);
            b.write(k, c.start * Hkv * d, c.k);
            b.write(v, c.start * Hkv * d, c.v);
          } catch (e) {
            fail(e);
            return;
          }
          writeMs += performance.now() - w0;
          rowsDone += c.end - c.start;
          opts.onProgress?.(rowsDone, n);
          if (++written === chunks.length) resolve();
          hand(w);
        });
        w.on('error', (e) => fail(new Error(`synth worker: ${e instanceof Error ? e.message : String(e)}`)));
        w.on('exit', (code) => {
          if (code !== 0) fail(new Error(`synth worker exited with code ${code}`));
        });
        hand(w);
      }
    });
    return { q, k, v, timing: { generateMs: performance.now() - t0 - writeMs, writeMs } };
  } catch (e) {
    for (const t of made) t.dispose();
    throw e;
  } finally {
    // a finished worker stops itself on 'stop'; a failed run stops them all
    await Promise.all(workers.map((w) => w.terminate()));
  }
}
