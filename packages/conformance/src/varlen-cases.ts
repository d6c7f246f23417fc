/**
 * Ragged (varlen) batch cases: `Backend.varlenAttention` on packed sequences of mixed lengths
 * (1, a block less one, a block, a block and one, long; some chunked over a KV prefix, some
 * dense, some sparse), and `varlenPrefill` end to end, each sequence checked against exact
 * float64 attention on its own rows over its own mask.
 *
 * Shape legend: q [Mq, H, d] and k, v [Nk, Hkv, d] packed; sequence s holds m_s queries (the
 * last m_s of its n_s positions) and n_s keys.
 */
import {
  type AttentionResult,
  type Backend,
  type BlockMask,
  type DType,
  type HostTensor,
  type Policy,
  type VarlenSegment,
  numBlocks,
  planPrefill,
  toFloat32,
  varlenPrefill,
  vsHead,
} from '@crisp/core';
import { attentionRows, sampleRows } from '@crisp/reference';
import {
  type CaseContext,
  type ConformanceCase,
  type ShapeCase,
  makeCase,
  outcome,
  poisoned,
  randomMask,
} from './cases.js';
import { maxMixedError, outputRows } from './compare.js';
import { type AttentionInputs, type Rng, attentionInputs } from './random.js';

/** One ragged batch: per sequence its query rows and key rows (default: equal). */
export interface VarlenShapeCase {
  readonly name: string;
  readonly queries: readonly number[];
  /** key rows per sequence (>= queries; more: a chunk over a KV prefix); default `queries`. A sequence of 0 queries (the pipeline's only) is empty */
  readonly keys?: readonly number[];
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** the attention case's block size (the pipeline case takes the policy's) */
  readonly blockSize: number;
  /** which cases: the attention primitive, the pipeline, or both (default) */
  readonly use?: 'primitives' | 'pipeline' | 'both';
}

/** CI shapes: every edge length beside a block boundary, a chunked sequence, GQA 4 and 1. */
export const SMALL_VARLEN: readonly VarlenShapeCase[] = Object.freeze([
  { name: 'lens1-63-64-65-300-c70of190-h8kv2-d64-b64', queries: [1, 63, 64, 65, 300, 70], keys: [1, 63, 64, 65, 300, 190], heads: 8, kvHeads: 2, headDim: 64, blockSize: 64, use: 'primitives' },
  { name: 'lens1-127-128-129-200-h4kv4-d128-b128', queries: [1, 127, 128, 129, 200], heads: 4, kvHeads: 4, headDim: 128, blockSize: 128, use: 'primitives' },
  { name: 'lens1-127-129-1100-1500-h4kv2-d64', queries: [1, 127, 129, 1100, 1500], heads: 4, kvHeads: 2, headDim: 64, blockSize: 64, use: 'pipeline' },
  // empty sequences (no queries; with cached keys, without, first and last) beside a sparse one and a sparse chunk
  { name: 'lens0of40-1-0of0-1100-0of9-c60of1200-0of0-h4kv2-d64', queries: [0, 1, 0, 1100, 0, 60, 0], keys: [40, 1, 0, 1100, 9, 1200, 0], heads: 4, kvHeads: 2, headDim: 64, blockSize: 64, use: 'pipeline' },
]);

/** GPU shapes: the lengths 1, 127, 128, 129, 5000 in one batch, H/Hkv 32/8 and 8/8, d 128. */
export const LARGE_VARLEN: readonly VarlenShapeCase[] = Object.freeze([
  { name: 'lens1-127-128-129-5000-h32kv8-d128-b128', queries: [1, 127, 128, 129, 5000], heads: 32, kvHeads: 8, headDim: 128, blockSize: 128 },
  { name: 'lens1-127-128-129-5000-h8kv8-d128-b64', queries: [1, 127, 128, 129, 5000], heads: 8, kvHeads: 8, headDim: 128, blockSize: 64 },
  { name: 'lens300of4000-1-20000-h32kv8-d128-b128', queries: [300, 1, 20000], keys: [4000, 1, 20000], heads: 32, kvHeads: 8, headDim: 128, blockSize: 128 },
]);

/** The batch's sequences drawn on their own and packed along the first axis. */
interface Packed {
  readonly parts: readonly AttentionInputs[];
  readonly segments: readonly VarlenSegment[];
  readonly q: HostTensor;
  readonly k: HostTensor;
  readonly v: HostTensor;
}

function pack(r: Rng, dtype: DType, s: VarlenShapeCase): Packed {
  const keys = s.keys ?? s.queries;
  const parts = s.queries.map((m, i) => attentionInputs(r, dtype, { n: keys[i], m, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim }));
  const segments: VarlenSegment[] = [];
  let qs = 0;
  let ks = 0;
  for (let i = 0; i < parts.length; i++) {
    segments.push({ qStart: qs, queries: s.queries[i], kStart: ks, keys: keys[i] });
    qs += s.queries[i];
    ks += keys[i];
  }
  const cat = (which: 'q' | 'k' | 'v', rows: number, heads: number): HostTensor => {
    const data = dtype === 'f32' ? new Float32Array(rows * heads * s.headDim) : new Uint16Array(rows * heads * s.headDim);
    let at = 0;
    for (const p of parts) {
      data.set(p[which].data as never, at);
      at += p[which].data.length;
    }
    return { dtype, shape: [rows, heads, s.headDim], data };
  };
  return { parts, segments, q: cat('q', qs, s.heads), k: cat('k', ks, s.kvHeads), v: cat('v', ks, s.kvHeads) };
}

function shapeOf(s: VarlenShapeCase): ShapeCase {
  const keys = s.keys ?? s.queries;
  return { name: s.name, n: Math.max(...keys), heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, blockSize: s.blockSize };
}

/**
 * Each sequence's rows of the packed output (and LSE) against exact attention on that
 * sequence alone over `masks[s]` (dense where undefined); every row up to the full-check
 * limit, sampled rows beyond.
 */
async function checkSegments(
  ctx: CaseContext,
  s: VarlenShapeCase,
  x: Packed,
  res: AttentionResult,
  masks: readonly (BlockMask | undefined)[],
  wantLse: boolean,
): Promise<{ error: number; lines: string[]; checked: number }> {
  const out = await ctx.backend.download(res.output);
  const Mq = x.q.shape[0];
  const lines: string[] = [];
  let error = 0;
  let checked = 0;
  if (out.dtype !== x.q.dtype || out.shape.join() !== x.q.shape.join()) {
    return { error: Number.POSITIVE_INFINITY, lines: [`output is ${out.dtype} [${out.shape}], expected ${x.q.dtype} [${x.q.shape}]`], checked };
  }
  let lse: Float32Array | undefined;
  if (wantLse) {
    if (!res.lse) lines.push('returnLse was asked for but no lse came back');
    else {
      const l = await ctx.backend.download(res.lse);
      if (l.dtype !== 'f32' || l.shape.join() !== [s.heads, Mq].join()) lines.push(`lse is ${l.dtype} [${l.shape}], expected f32 [${s.heads}, ${Mq}]`);
      else lse = toFloat32(l);
    }
  }
  for (let i = 0; i < x.segments.length; i++) {
    const g = x.segments[i];
    const p = x.parts[i];
    if (g.queries === 0) continue; // an empty sequence has no rows
    const rows = g.keys <= ctx.fullCheckLimit ? sampleRows(g.queries, g.queries) : sampleRows(g.queries, ctx.sampleCount);
    checked += rows.length;
    const exact = attentionRows(p.q, p.k, p.v, rows, masks[i]);
    const got = outputRows(out, rows.map((t) => g.qStart + t));
    const e = maxMixedError(got, exact.output);
    error = Math.max(error, e.error);
    if (!(e.error <= ctx.tolerance.output)) {
      const hd = s.heads * s.headDim;
      lines.push(
        `sequence ${i} (m ${g.queries}, n ${g.keys}, ${masks[i] ? 'sparse' : 'dense'}): error ${e.error.toExponential(3)} at its query row ${rows[Math.floor(e.index / hd)]}, head ${Math.floor((e.index % hd) / s.headDim)}: got ${got[e.index]}, exact ${exact.output[e.index]}`,
      );
    }
    if (lse) {
      const gotL = new Float64Array(s.heads * rows.length);
      for (let h = 0; h < s.heads; h++) for (const [t, row] of rows.entries()) gotL[h * rows.length + t] = lse[h * Mq + g.qStart + row];
      const el = maxMixedError(gotL, exact.lse);
      if (!(el.error <= ctx.tolerance.lse)) lines.push(`sequence ${i}: lse error ${el.error.toExponential(3)} > ${ctx.tolerance.lse}`);
    }
  }
  return { error, lines, checked };
}

function uploadPacked(be: Backend, x: Packed) {
  return { q: be.upload(x.q), k: be.upload(x.k), v: be.upload(x.v) };
}

/** varlenAttention: random masks (every form) on some sequences, dense on the others, LSE. */
function varlenAttentionCase(dtype: DType, s: VarlenShapeCase): ConformanceCase {
  return makeCase(`varlen/attention/${s.name}/${dtype}`, dtype, shapeOf(s), s.blockSize, async (ctx, r) => {
    const x = pack(r, dtype, s);
    const B = s.blockSize;
    const forms = ['vs', 'rows', 'mixed', undefined] as const;
    const masks = x.segments.map((g, i) => {
      const form = forms[i % forms.length];
      return form ? randomMask(r, form, s.heads, numBlocks(g.keys, B), B) : undefined;
    });
    const be = ctx.backend;
    const d = uploadPacked(be, x);
    const out = poisoned(be, dtype, x.q.shape);
    const wantLse = be.capabilities.logSumExp;
    try {
      const res = await be.varlenAttention!(d.q, d.k, d.v, { blockSize: B, segments: x.segments, masks }, { out, returnLse: wantLse });
      if (res.output !== out) return outcome(Number.POSITIVE_INFINITY, ctx.tolerance.output, ['the result is not the tensor passed as opts.out']);
      const c = await checkSegments(ctx, s, x, res, masks, wantLse);
      res.lse?.dispose();
      return outcome(c.error, ctx.tolerance.output, c.lines, `${x.segments.length} sequences, ${c.checked} query rows checked`);
    } finally {
      out.dispose();
      for (const t of [d.q, d.k, d.v]) t.dispose();
    }
  });
}

/**
 * varlenPrefill end to end: each sequence's plan must equal the backend's own plan of that
 * sequence alone (same routes, VS lists, density, dense reason): planned on its own), and its
 * rows must match exact attention over that plan's mask.
 */
function varlenPipelineCase(dtype: DType, s: VarlenShapeCase, policy: Policy): ConformanceCase {
  const B = policy.blockSize ?? 128;
  return makeCase(`varlen/pipeline/${policy.name}/${s.name}/${dtype}`, dtype, { ...shapeOf(s), blockSize: B }, B, async (ctx, r) => {
    const x = pack(r, dtype, s);
    const be = ctx.backend;
    const d = uploadPacked(be, x);
    const out = poisoned(be, dtype, x.q.shape);
    const wantLse = be.capabilities.logSumExp;
    const lines: string[] = [];
    try {
      const cu = [0, ...x.segments.map((g) => g.qStart + g.queries)];
      const cuK = [0, ...x.segments.map((g) => g.kStart + g.keys)];
      const res = await varlenPrefill(be, d, { cuSeqlensQ: cu, cuSeqlensK: cuK }, policy, { minSparseLength: 0, out, returnLse: wantLse });
      if (res.output !== out) lines.push('the result is not the tensor passed as opts.out');
      if (res.plans.length !== x.segments.length) lines.push(`${res.plans.length} plans for ${x.segments.length} sequences`);
      let sparse = 0;
      for (let i = 0; i < x.segments.length && i < res.plans.length; i++) {
        const p = x.parts[i];
        if (x.segments[i].queries === 0) {
          if (res.plans[i].denseReason !== 'empty') lines.push(`sequence ${i} has no queries but its plan is ${res.plans[i].denseReason ?? 'sparse'}, not 'empty'`);
          continue;
        }
        const alone = { q: be.upload(p.q), k: be.upload(p.k) };
        try {
          const own = await planPrefill(be, alone, policy, { minSparseLength: 0 });
          own.prepared?.release();
          const got = res.plans[i];
          if (got.denseReason !== own.denseReason) lines.push(`sequence ${i}: plan ${got.denseReason ?? 'sparse'}, alone ${own.denseReason ?? 'sparse'}`);
          if (got.mask) sparse++;
          if (got.routing && own.routing && got.routing.routes.join() !== own.routing.routes.join()) {
            lines.push(`sequence ${i}: routes ${got.routing.routes.join('')} differ from its plan alone ${own.routing.routes.join('')}`);
          }
          if (got.mask?.vs && own.mask?.vs) {
            for (let h = 0; h < s.heads; h++) {
              const a = vsHead(got.mask.vs, h);
              const b = vsHead(own.mask.vs, h);
              if (a.vertical.join() !== b.vertical.join() || a.slash.join() !== b.slash.join()) {
                lines.push(`sequence ${i} head ${h}: VS lists differ from its plan alone`);
                break;
              }
            }
          }
          if (Math.abs(got.overallDensity - own.overallDensity) > 1e-12) {
            lines.push(`sequence ${i}: density ${got.overallDensity} vs ${own.overallDensity} alone`);
          }
        } finally {
          alone.q.dispose();
          alone.k.dispose();
        }
      }
      const c = await checkSegments(ctx, s, x, res, res.plans.map((p) => p.mask), wantLse);
      res.lse?.dispose();
      lines.push(...c.lines);
      return outcome(c.error, ctx.tolerance.output, lines, `${sparse} of ${x.segments.length} sequences sparse, density ${res.overallDensity.toFixed(4)}, ${c.checked} query rows checked`);
    } finally {
      out.dispose();
      for (const t of [d.q, d.k, d.v]) t.dispose();
    }
  });
}

/** The varlen cases for the given shapes, dtypes and policies (pipeline: the policies that route). */
export function buildVarlenCases(sizes: readonly VarlenShapeCase[], dtypes: readonly DType[], policies: readonly Policy[]): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  for (const dtype of dtypes) {
    for (const s of sizes) {
      const use = s.use ?? 'both';
      const mark = (c: ConformanceCase): ConformanceCase => ({ ...c, needs: { ...c.needs, chunked: (s.keys ?? s.queries).some((n, i) => n !== s.queries[i]), varlen: true } });
      if (use !== 'pipeline') out.push(mark(varlenAttentionCase(dtype, s)));
      if (use !== 'primitives') for (const p of policies) if (p.router) out.push(mark(varlenPipelineCase(dtype, s, p)));
    }
  }
  return out;
}
