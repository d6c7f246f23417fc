/**
 * What a run will need, checked against what the backend and the machine have before
 * anything is generated, read or allocated: the backend's dtypes, head dims, block sizes and
 * longest sequence; the longest JS typed array (every output is downloaded into one); host
 * memory; device memory where the backend says how much it has.
 *
 * Shape legend: n tokens, H query heads, Hkv kv heads, d head dim, B block size, Nb = ceil(n / B).
 */
import { totalmem } from 'node:os';
import { type Backend, type DType, LimitError, UnsupportedError, bytesPerElement } from '@crisp/core';

/** Longest typed array V8 makes on a 64-bit host (elements). */
export const MAX_TYPED_ARRAY_LENGTH = 2 ** 32;

export interface ProblemSize {
  readonly n: number;
  readonly H: number;
  readonly Hkv: number;
  readonly d: number;
  readonly dtype: DType;
  readonly blockSize: number;
  /** exact query rows for mass recall (0: none, as in calibrate) */
  readonly sampleRows: number;
  /** policies run after dense (each downloads one output) */
  readonly policies: number;
}

/** Where the sizes came from, for the advice: the flags, or a file's header. */
export type SizeSource = { readonly kind: 'flags' } | { readonly kind: 'file'; readonly path: string };

export interface MemoryBudget {
  /** bytes of host memory this process may use */
  readonly hostBytes: number;
  /** bytes of device memory, when the backend tells */
  readonly deviceBytes?: number;
  /** largest single device buffer, when the backend tells */
  readonly maxBufferBytes?: number;
}

const GiB = 1024 ** 3;
const gib = (b: number) => `${(b / GiB).toFixed(b < 10 * GiB ? 2 : 1)} GiB`;

/** Host memory this process may use: the machine's, or a smaller cgroup limit. */
export function hostMemoryBytes(): number {
  const total = totalmem();
  const constrained = typeof process.constrainedMemory === 'function' ? process.constrainedMemory() : 0;
  return constrained && constrained > 0 && constrained < total ? constrained : total;
}

/** What the backend says about its memory (CUDA: total device memory; WebGPU: largest buffer). */
export function budgetFor(backend: Backend, hostBytes = hostMemoryBytes()): MemoryBudget {
  const b = backend as { info?: { totalMemory?: unknown }; gpu?: { limits?: { maxBufferSize?: unknown } } };
  const total = b.info?.totalMemory;
  const maxBuf = b.gpu?.limits?.maxBufferSize;
  return {
    hostBytes,
    deviceBytes: typeof total === 'number' && total > 0 ? total : undefined,
    maxBufferBytes: typeof maxBuf === 'number' && maxBuf > 0 ? maxBuf : undefined,
  };
}

export interface MemoryEstimate {
  readonly hostBytes: number;
  readonly deviceBytes: number;
  /** the host's largest parts, biggest first, for the message */
  readonly hostParts: readonly { readonly what: string; readonly bytes: number }[];
}

/** Peak bytes of a run: inputs, outputs, downloads, the exact rows' block masses. */
export function estimateMemory(p: ProblemSize, hostIsDevice: boolean): MemoryEstimate {
  const bpe = bytesPerElement(p.dtype);
  const qE = p.n * p.H * p.d;
  const kE = p.n * p.Hkv * p.d;
  const Nb = Math.ceil(p.n / p.blockSize);
  const rows = Math.min(p.sampleRows, p.n);
  const device = (qE + 2 * kE) * bpe + 2 * qE * bpe;
  const parts: { what: string; bytes: number }[] = [
    { what: 'downloaded outputs (dense and sparse)', bytes: p.policies > 0 ? 2 * qE * bpe : 0 },
    { what: 'k on the host for mass recall (f32)', bytes: rows > 0 ? kE * (bpe + 4) : 0 },
    { what: `block masses of ${rows} exact rows (--sample-rows)`, bytes: rows * p.H * Nb * 8 },
  ];
  if (hostIsDevice) {
    parts.push({ what: 'q, k, v and outputs in host memory (reference backend)', bytes: device });
    // The reference decodes q, k, v to f32 and copies them head-major in f64 for each op.
    parts.push({ what: 'f32 and f64 working copies of q, k, v (reference backend)', bytes: (qE + 2 * kE) * 12 + qE * 8 });
  }
  parts.sort((a, b) => b.bytes - a.bytes);
  return { hostBytes: parts.reduce((s, x) => s + x.bytes, 0), deviceBytes: hostIsDevice ? 0 : device, hostParts: parts };
}

function advice(src: SizeSource, flags: string): string {
  return src.kind === 'flags' ? `pass a smaller ${flags}` : `use a smaller dump than ${src.path} (fewer tokens or heads)`;
}

/**
 * Throws UNSUPPORTED or LIMIT_EXCEEDED when the problem cannot run on this backend and
 * machine. Cheap: arithmetic on the sizes only.
 */
export function checkProblem(backend: Backend, p: ProblemSize, src: SizeSource, budget: MemoryBudget = budgetFor(backend)): void {
  const caps = backend.capabilities;
  const name = backend.name;
  const fromFile = src.kind === 'file' ? ` (from ${src.path})` : '';
  if (!caps.dtypes.includes(p.dtype)) {
    throw new UnsupportedError(
      `the ${name} backend does not take ${p.dtype}${fromFile}; pass --dtype ${caps.dtypes.join(' or ')} (or another --backend)`,
      { limit: 'dtype' },
    );
  }
  if (!caps.headDims.includes(p.d)) {
    throw new UnsupportedError(
      `the ${name} backend has no kernel for head dim ${p.d}${fromFile}; it supports ${caps.headDims.join(', ')}${src.kind === 'flags' ? ': pass one with --head-dim' : ''}, or pick another --backend`,
      { limit: 'headDim' },
    );
  }
  if (!caps.blockSizes.includes(p.blockSize)) {
    throw new UnsupportedError(`the ${name} backend does not take block size ${p.blockSize}; pass --block ${caps.blockSizes.filter((b) => b === 64 || b === 128).join(' or ') || 'of another size'} or pick another --backend`, {
      limit: 'blockSize',
    });
  }
  if (p.n > caps.maxSequence) {
    throw new LimitError(
      `n = ${p.n}${fromFile} exceeds the ${name} backend's limit of ${caps.maxSequence} tokens; ${src.kind === 'flags' ? `pass --n ${caps.maxSequence} or less` : 'use a shorter dump'}, or pick another --backend`,
      { limit: 'maxSequence', max: caps.maxSequence, n: p.n },
    );
  }
  const qE = p.n * p.H * p.d;
  if (qE > MAX_TYPED_ARRAY_LENGTH) {
    throw new LimitError(
      `n·H·d = ${p.n}·${p.H}·${p.d} = ${qE} values${fromFile} is more than one JS typed array holds (${MAX_TYPED_ARRAY_LENGTH}), and the output is downloaded into one; ${advice(src, '--n, --heads or --head-dim')}`,
      { limit: 'typedArray', max: MAX_TYPED_ARRAY_LENGTH, elements: qE },
    );
  }
  const est = estimateMemory(p, name === 'reference');
  if (budget.maxBufferBytes !== undefined && qE * bytesPerElement(p.dtype) > budget.maxBufferBytes) {
    throw new LimitError(
      `q would take ${gib(qE * bytesPerElement(p.dtype))} in one buffer${fromFile}; this ${name} device's largest buffer is ${gib(budget.maxBufferBytes)}; ${advice(src, '--n or --heads')}`,
      { limit: 'maxBufferSize', max: budget.maxBufferBytes },
    );
  }
  if (budget.deviceBytes !== undefined && est.deviceBytes > budget.deviceBytes) {
    throw new LimitError(
      `q, k, v and the outputs need about ${gib(est.deviceBytes)} of device memory${fromFile}; the ${name} device has ${gib(budget.deviceBytes)}; ${advice(src, '--n or --heads')}`,
      { limit: 'deviceMemory', max: budget.deviceBytes, bytes: est.deviceBytes },
    );
  }
  if (est.hostBytes > budget.hostBytes) {
    const top = est.hostParts[0];
    const flags = top.what.includes('--sample-rows') ? '--sample-rows, --n or --heads' : '--n, --heads or --head-dim';
    throw new LimitError(
      `this run needs about ${gib(est.hostBytes)} of host memory${fromFile} (most of it ${top.what}: ${gib(top.bytes)}); this machine has ${gib(budget.hostBytes)}; ${advice(src, flags)}`,
      { limit: 'hostMemory', max: budget.hostBytes, bytes: est.hostBytes },
    );
  }
}

/** Multiply-adds of the exact rows (and, on the reference backend, of dense attention). */
export function workEstimate(p: ProblemSize, reference: boolean): number {
  const rows = Math.min(p.sampleRows, p.n);
  const exact = rows * p.H * p.n * p.d;
  const dense = reference ? (p.n * p.n * p.H * p.d) / 2 : 0;
  return exact + dense * (1 + p.policies);
}

/** A note, not an error, when the run will take long on the host (roughly > 10 minutes). */
export function slowRunNote(p: ProblemSize, reference: boolean): string | undefined {
  const work = workEstimate(p, reference);
  if (work < 2e11) return undefined;
  return `this run does about ${work.toExponential(1)} multiply-adds on the CPU${reference ? ' (the reference backend computes attention in plain TypeScript)' : ' (exact rows for mass recall)'}; expect a long wait, or pass a smaller --n${reference ? ' or a GPU --backend' : ' or --sample-rows'}`;
}
