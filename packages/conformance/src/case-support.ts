/**
 * What a conformance case is (its shape, context and outcome) and what every case file
 * shares: uploads, NaN-poisoned outputs, the checked rows, outcomes, the float64 attention
 * check and random masks in the three forms.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import {
  type Backend,
  type BlockMask,
  type BlockRows,
  type DType,
  type DeviceRouterRule,
  type DeviceSelectorRule,
  type DeviceTensor,
  type HostTensor,
  toFloat32,
  vsListsFromArrays,
} from '@crisp/core';
import { attentionRows, sampleRows } from '@crisp/reference';
import {
  type Tolerance,
  maxMixedError,
  outputRows,
} from './compare.js';
import { type AttentionInputs, type Rng, rng } from './random.js';

export interface ShapeCase {
  /** used in case names; default derived from the numbers */
  readonly name?: string;
  /** keys (sequence length) */
  readonly n: number;
  /** query rows, the last m of n positions (chunked prefill); default n */
  readonly m?: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** block size for the primitive cases (pipeline cases take the policy's) */
  readonly blockSize: number;
  /** which cases use this shape (default 'primitives') */
  readonly use?: 'primitives' | 'pipeline' | 'both';
}

export function shapeName(s: ShapeCase): string {
  if (s.name) return s.name;
  const m = s.m !== undefined && s.m !== s.n ? `-m${s.m}` : '';
  return `n${s.n}${m}-h${s.heads}kv${s.kvHeads}-d${s.headDim}-b${s.blockSize}`;
}


export interface CaseContext {
  readonly backend: Backend;
  readonly reference: Backend;
  readonly seed: number;
  readonly tolerance: Tolerance;
  /** full exact checks up to this many keys; beyond it `sampleCount` sampled query rows */
  readonly fullCheckLimit: number;
  readonly sampleCount: number;
}

export interface CaseOutcome {
  readonly passed: boolean;
  readonly maxError: number;
  readonly tolerance: number;
  readonly detail: string;
  /** the case could not run here (the environment lacks what it needs), and why */
  readonly skipped?: string;
}

export interface ConformanceCase {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: ShapeCase;
  /** what the backend must support for the case to apply */
  readonly needs: {
    readonly blockSize: number;
    readonly chunked: boolean;
    readonly deviceSelector?: DeviceSelectorRule['kind'];
    readonly deviceRouter?: DeviceRouterRule['kind'];
    /** the backend's planner narrows PE heads' lists on the device and takes them at their own α (`DevicePlanner.peVsExcess`, `peVs`) */
    readonly narrowedPeLists?: boolean;
    /** the backend returns the LSE (`capabilities.logSumExp`) */
    readonly lse?: boolean;
    /** a ragged batch: the backend's varlenAttention (and sliceRows for the pipeline) */
    readonly varlen?: boolean;
  };
  run(ctx: CaseContext): Promise<CaseOutcome>;
}

// ---------------------------------------------------------------------------------------
// helpers

/** @internal shared with the varlen cases */
export function upload(be: Backend, x: AttentionInputs): { q: DeviceTensor; k: DeviceTensor; v: DeviceTensor } {
  return { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
}

const NAN_BITS: Record<DType, number> = { f32: Number.NaN, f16: 0x7e00, bf16: 0x7fc0 };

/** An output tensor filled with NaN, so a kernel that skips a row cannot pass. */
/** @internal shared with the varlen cases */
export function poisoned(be: Backend, dtype: DType, shape: readonly number[]): DeviceTensor {
  const t = be.allocate(dtype, shape);
  const len = shape.reduce((a, b) => a * b, 1);
  const fill = dtype === 'f32' ? new Float32Array(len) : new Uint16Array(len);
  fill.fill(NAN_BITS[dtype]);
  be.write(t, 0, fill);
  return t;
}

/** @internal shared with the varlen cases */
export function checkRowsFor(ctx: CaseContext, s: ShapeCase): number[] {
  const m = s.m ?? s.n;
  return s.n <= ctx.fullCheckLimit ? sampleRows(m, m) : sampleRows(m, ctx.sampleCount);
}

/** @internal shared with the varlen cases */
export function outcome(error: number, tolerance: number, lines: string[], info = ''): CaseOutcome {
  const passed = lines.length === 0 && error <= tolerance;
  const head = passed ? 'ok' : `error ${error.toExponential(3)} vs tolerance ${tolerance.toExponential(3)}`;
  return { passed, maxError: error, tolerance, detail: [head + (info ? `; ${info}` : ''), ...lines].join('\n') };
}

/**
 * Compare a downloaded attention output (and LSE) with exact float64 rows over `mask`, at
 * softmax scale `scale` (default 1/sqrt(d)).
 * @internal shared with the LSE merge cases
 */
export async function checkAttention(
  ctx: CaseContext,
  s: ShapeCase,
  x: AttentionInputs,
  output: HostTensor,
  lse: DeviceTensor | undefined,
  mask: BlockMask | undefined,
  wantLse: boolean,
  scale?: number,
): Promise<CaseOutcome> {
  const lines: string[] = [];
  const m = s.m ?? s.n;
  if (output.dtype !== x.q.dtype || output.shape.join() !== [m, s.heads, s.headDim].join()) {
    return outcome(Number.POSITIVE_INFINITY, ctx.tolerance.output, [
      `output is ${output.dtype} [${output.shape}], expected ${x.q.dtype} [${m}, ${s.heads}, ${s.headDim}]`,
    ]);
  }
  const rows = checkRowsFor(ctx, s);
  const exact = attentionRows(x.q, x.k, x.v, rows, mask, { scale });
  const got = outputRows(output, rows);
  const r = maxMixedError(got, exact.output);
  const where = (idx: number) => {
    const hd = s.heads * s.headDim;
    return `query row ${rows[Math.floor(idx / hd)]}, head ${Math.floor((idx % hd) / s.headDim)}, column ${idx % s.headDim}`;
  };
  if (!(r.error <= ctx.tolerance.output)) {
    lines.push(`worst output at ${where(r.index)}: got ${got[r.index]}, exact ${exact.output[r.index]}`);
  }
  let lseErr = 0;
  if (wantLse) {
    if (!lse) lines.push('returnLse was asked for but no lse came back');
    else {
      const l = await ctx.backend.download(lse);
      if (l.dtype !== 'f32' || l.shape.join() !== [s.heads, m].join()) {
        lines.push(`lse is ${l.dtype} [${l.shape}], expected f32 [${s.heads}, ${m}]`);
      } else {
        const vals = toFloat32(l);
        const gotL = new Float64Array(s.heads * rows.length);
        for (let h = 0; h < s.heads; h++) for (const [t, i] of rows.entries()) gotL[h * rows.length + t] = vals[h * m + i];
        const e = maxMixedError(gotL, exact.lse);
        lseErr = e.error;
        if (!(e.error <= ctx.tolerance.lse)) {
          lines.push(
            `lse error ${e.error.toExponential(3)} > ${ctx.tolerance.lse} at head ${Math.floor(e.index / rows.length)}, query row ${rows[e.index % rows.length]}: got ${gotL[e.index]}, exact ${exact.lse[e.index]}`,
          );
        }
      }
    }
  }
  return outcome(r.error, ctx.tolerance.output, lines, `${rows.length} of ${m} query rows checked${wantLse ? `, lse error ${lseErr.toExponential(2)}` : ''}`);
}

/** A random mask in one of the three forms; every query block keeps its diagonal block. */
export function randomMask(r: Rng, form: 'vs' | 'rows' | 'mixed', H: number, Nb: number, B: number): BlockMask {
  const pick = (p: number) => r() < p;
  let vs: BlockMask['vs'];
  let rows: BlockRows | undefined;
  if (form !== 'rows') {
    const vertical: number[][] = [];
    const slash: number[][] = [];
    for (let h = 0; h < H; h++) {
      vertical.push([...Array(Nb).keys()].filter((J) => J === 0 || pick(0.3)));
      // Mixed masks get the diagonal from the rows part, so their slash lists may skip 0.
      slash.push([...Array(Nb).keys()].filter((O) => (O === 0 && form === 'vs') || pick(0.3)));
    }
    vs = vsListsFromArrays(vertical, slash);
  }
  if (form !== 'vs') {
    const rowPtr = new Int32Array(H * Nb + 1);
    const cols: number[] = [];
    for (let h = 0; h < H; h++) {
      for (let I = 0; I < Nb; I++) {
        for (let J = 0; J <= I; J++) if (J === I || pick(form === 'rows' ? 0.4 : 0.2)) cols.push(J);
        rowPtr[h * Nb + I + 1] = cols.length;
      }
    }
    rows = { rowPtr, cols: Int32Array.from(cols) };
  }
  return { heads: H, numBlocks: Nb, blockSize: B, vs, rows };
}

/** @internal rows that differ between two expansions, for the messages */
export function sameRows(a: BlockRows, b: BlockRows, H: number, Nb: number): string[] {
  const lines: string[] = [];
  if (a.rowPtr.length !== b.rowPtr.length) return [`rowPtr length ${a.rowPtr.length}, expected ${b.rowPtr.length}`];
  for (let r = 0; r < H * Nb && lines.length < 5; r++) {
    const x = Array.from(a.cols.subarray(a.rowPtr[r], a.rowPtr[r + 1]));
    const y = Array.from(b.cols.subarray(b.rowPtr[r], b.rowPtr[r + 1]));
    if (x.join() !== y.join()) lines.push(`head ${Math.floor(r / Nb)} row ${r % Nb}: got [${x}], expected [${y}]`);
  }
  return lines;
}


export type CaseBody = (ctx: CaseContext, r: Rng) => Promise<CaseOutcome>;

/** @internal shared with the varlen cases */
export function makeCase(name: string, dtype: DType, shape: ShapeCase, blockSize: number, body: CaseBody): ConformanceCase {
  return {
    name,
    dtype,
    shape,
    needs: { blockSize, chunked: (shape.m ?? shape.n) !== shape.n },
    run: (ctx) => body(ctx, rng(ctx.seed)),
  };
}

/** Same length and the same values (NaN equal to NaN). */
export function bitEqual(a: ArrayLike<number>, b: ArrayLike<number>): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i] && !(Number.isNaN(a[i]) && Number.isNaN(b[i]))) return false;
  return true;
}
