/**
 * The proxy statistics' way back to the host: the device buffers proxyStats fills, read and
 * turned into ProxyStats' f64 fields, at once or (deferRead) when `settle()` is called.
 * Deferred statistics keep their buffers on the device until then, and a device plan
 * (../plan/planner.ts) reads the block sums there instead of uploading host values.
 *
 * Shape legend: H heads, b proxy rows, Nb blocks, n keys.
 */
import { InvalidArgumentError, NonFiniteError, type ProxyStats } from '@crisp/core';
import type { GpuContext } from '../runtime/gpu-context.js';
import type { OpHost } from './host.js';

/** The buffers the statistics are read from (proxyStats' layouts). */
export interface KeptBuffers {
  /** [H][b][4] f32: max, normaliser, entropy, non-finite flag per proxy row */
  readonly rows: GPUBuffer;
  /** [H][Nb + 1][2] f32: vertical and slash block sums; C_struct in the vertical slot of entry Nb */
  readonly sums: GPUBuffer;
  /** [H][Nb] f32: the pooled estimate's logits */
  readonly logits: GPUBuffer;
  /** [H][n] f32 token scores, when asked for */
  readonly av?: GPUBuffer;
  readonly as?: GPUBuffer;
  /** false: the token scores stay on the device (tokenScores 'device'), not read into the statistics */
  readonly readTokens?: boolean;
}

interface StatsShape {
  readonly n: number;
  readonly heads: number;
  readonly blockSize: number;
  readonly numBlocks: number;
  readonly proxyRows: number;
}

type StatsFields = Pick<ProxyStats, 'cStruct' | 'verticalBlocks' | 'slashBlocks' | 'pooledEstimate' | 'rowEntropy' | 'verticalTokens' | 'slashTokens'>;

/**
 * Read the statistics' buffers and turn them into ProxyStats' fields; NON_FINITE when a proxy
 * row saw NaN or Inf in q or k.
 */
export async function readStats(host: OpHost, s: StatsShape, kept: KeptBuffers): Promise<StatsFields> {
  const { heads: H, numBlocks: Nb, proxyRows: b, n } = s;
  const g = host.gpu;
  const [rowsAb, sumsAb, logitsAb, avAb, asAb] = await Promise.all([
    g.read(kept.rows, 0, H * b * 16),
    g.read(kept.sums, 0, H * (Nb + 1) * 8),
    g.read(kept.logits, 0, H * Nb * 4),
    kept.av && kept.readTokens !== false ? g.read(kept.av, 0, H * n * 4) : undefined,
    kept.as && kept.readTokens !== false ? g.read(kept.as, 0, H * n * 4) : undefined,
  ]);
  const rowStats = new Float32Array(rowsAb);
  for (let r = 0; r < H * b; r++) {
    if (rowStats[r * 4 + 3] !== 0) {
      throw new NonFiniteError(`q or k holds NaN or Inf (seen by proxy row ${r % b} of head ${Math.floor(r / b)}); clean the inputs first`, {
        head: Math.floor(r / b),
      });
    }
  }
  const blockSums = new Float32Array(sumsAb);
  const lg = new Float32Array(logitsAb);
  const cStruct = new Float64Array(H);
  const rowEntropy = new Float64Array(H);
  const verticalBlocks = new Float64Array(H * Nb);
  const slashBlocks = new Float64Array(H * Nb);
  const pooledEstimate = new Float64Array(H * Nb);
  for (let h = 0; h < H; h++) {
    let e = 0;
    for (let i = 0; i < b; i++) e += rowStats[(h * b + i) * 4 + 2];
    rowEntropy[h] = e / b;
    const base = h * (Nb + 1);
    cStruct[h] = blockSums[(base + Nb) * 2];
    for (let J = 0; J < Nb; J++) {
      verticalBlocks[h * Nb + J] = blockSums[(base + J) * 2];
      slashBlocks[h * Nb + J] = blockSums[(base + J) * 2 + 1];
    }
    let mx = Number.NEGATIVE_INFINITY;
    for (let J = 0; J < Nb; J++) mx = Math.max(mx, lg[h * Nb + J]);
    let z = 0;
    for (let J = 0; J < Nb; J++) z += Math.exp(lg[h * Nb + J] - mx);
    for (let J = 0; J < Nb; J++) pooledEstimate[h * Nb + J] = Math.exp(lg[h * Nb + J] - mx) / z;
  }
  return {
    cStruct,
    verticalBlocks,
    slashBlocks,
    pooledEstimate,
    rowEntropy,
    verticalTokens: avAb ? new Float32Array(avAb) : undefined,
    slashTokens: asAb ? new Float32Array(asAb) : undefined,
  };
}

/** Deferred statistics' buffers, while they are on the device and not read back yet. */
const keptOf = new WeakMap<ProxyStats, { readonly gpu: GpuContext; readonly buffers: KeptBuffers }>();

/** Buffers of deferred statistics dropped unsettled go back once the object is collected. */
const KEPT_FINALIZER = new FinalizationRegistry<{ gpu: GpuContext; buffers: GPUBuffer[] }>((h) => h.gpu.retire(...h.buffers));

const FIELDS = ['cStruct', 'verticalBlocks', 'slashBlocks', 'pooledEstimate', 'rowEntropy', 'verticalTokens', 'slashTokens'] as const;

/**
 * Statistics whose fields are read from `kept` by `settle()` (each field throws
 * INVALID_ARGUMENT until then); the buffers go back once read.
 */
export function deferredStats(host: OpHost, s: StatsShape, kept: KeptBuffers): ProxyStats {
  const bufs = [kept.rows, kept.sums, kept.logits, ...(kept.av ? [kept.av] : []), ...(kept.as ? [kept.as] : [])];
  let values: StatsFields | undefined;
  let pending: Promise<void> | undefined;
  const stats = { ...s } as ProxyStats & { settle: () => Promise<void> };
  for (const f of FIELDS) {
    if ((f === 'verticalTokens' || f === 'slashTokens') && (!kept.av || kept.readTokens === false)) continue;
    Object.defineProperty(stats, f, {
      enumerable: true,
      get() {
        if (!values) {
          throw new InvalidArgumentError(`these proxy statistics were queued with deferRead on WebGPU, whose reads are asynchronous: await stats.settle() before reading ${f}`);
        }
        return values[f];
      },
    });
  }
  const settle = (): Promise<void> => {
    if (pending) return pending;
    // from here on a device plan uploads the host values (the buffers are retired once read)
    keptOf.delete(stats);
    KEPT_FINALIZER.unregister(stats);
    pending = (async () => {
      try {
        values = await readStats(host, s, kept);
      } finally {
        host.gpu.retire(...bufs);
      }
    })();
    return pending;
  };
  Object.defineProperty(stats, 'settle', { value: settle, enumerable: false });
  keptOf.set(stats, { gpu: host.gpu, buffers: kept });
  KEPT_FINALIZER.register(stats, { gpu: host.gpu, buffers: bufs }, stats);
  return stats;
}

/**
 * The buffers of statistics this backend's proxyStats made with deferRead and that were not
 * read back yet (a device plan reads the block sums, the pooled logits and, where asked for,
 * the token scores there); undefined otherwise (then the host values are there to upload).
 */
export function keptBuffers(gpu: GpuContext, stats: ProxyStats): KeptBuffers | undefined {
  const k = keptOf.get(stats);
  return k && k.gpu === gpu ? k.buffers : undefined;
}
