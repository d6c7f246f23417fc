/**
 * The exact rows of the mass-recall check on worker threads: k is copied once into shared
 * memory, each worker takes every W-th row (rows grow longer, so this balances the work) and
 * sends back its block masses. The same rowBlockMasses as on one thread: the same bits.
 *
 * Workers run the process's own entry (like the scenario's generation): runProcess calls
 * serveCheckRows first, and in a worker started here it serves and nothing else runs.
 */
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { type CheckDims, rowBlockMasses } from './check.js';

const FLAG = 'crispCheckRowsWorker';

interface Job {
  readonly dims: CheckDims;
  readonly k: SharedArrayBuffer;
  readonly rows: readonly number[];
  /** q of each row, [H * d] f32 */
  readonly q: readonly Float32Array[];
}

/** Call first in the entry: true in a worker started by blockMassesOnWorkers (it then computes and exits). */
export function serveCheckRows(): boolean {
  if (isMainThread || !parentPort || (workerData as Record<string, unknown> | null)?.[FLAG] !== true) return false;
  const job = (workerData as { job: Job }).job;
  const k = new Float32Array(job.k);
  const logits = new Float64Array(job.dims.n);
  const masses = job.rows.map((i, r) => rowBlockMasses(job.q[r], k, i, job.dims, logits));
  parentPort.postMessage(
    masses,
    masses.map((m) => m.buffer as ArrayBuffer),
  );
  return true;
}

/** Block masses [rows][H][Nb] of `rows`, computed by `threads` workers running `workerUrl`. */
export async function blockMassesOnWorkers(
  k: Float32Array,
  qRows: readonly Float32Array[],
  rows: readonly number[],
  dims: CheckDims,
  opts: { readonly threads: number; readonly workerUrl: URL },
): Promise<Float64Array[]> {
  const shared = new SharedArrayBuffer(k.byteLength);
  new Float32Array(shared).set(k);
  const W = Math.max(1, Math.min(Math.floor(opts.threads), rows.length));
  const out: Float64Array[] = new Array(rows.length);
  const workers: Worker[] = [];
  try {
    await Promise.all(
      Array.from({ length: W }, (_, w) => {
        const mine = rows.map((_, r) => r).filter((r) => r % W === w);
        const job: Job = { dims, k: shared, rows: mine.map((r) => rows[r]), q: mine.map((r) => qRows[r]) };
        return new Promise<void>((resolve, reject) => {
          const worker = new Worker(opts.workerUrl, { workerData: { [FLAG]: true, job } });
          workers.push(worker);
          worker.once('message', (masses: Float64Array[]) => {
            mine.forEach((r, t) => {
              out[r] = masses[t];
            });
            resolve();
          });
          worker.once('error', (e) => reject(new Error(`check worker: ${e instanceof Error ? e.message : String(e)}`)));
          worker.once('exit', (code) => {
            if (code !== 0) reject(new Error(`check worker exited with code ${code}`));
          });
        });
      }),
    );
    return out;
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}
