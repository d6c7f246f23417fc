/**
 * Ragged (varlen) batches: several sequences packed along the first axis, FlashAttention's
 * and FlashInfer's `cu_seqlens` layout. Each sequence is planned on its own (its own proxy
 * rows, C_struct, noise floor, length gate); the attention of the whole batch is one
 * backend call (`Backend.varlenAttention`: one launch on the GPU backends).
 *
 * Shape legend: q [Mq, H, d] packed (Mq = Σ m_s), k and v [Nk, Hkv, d] packed (Nk = Σ n_s),
 * sequence s: query rows cuSeqlensQ[s] .. cuSeqlensQ[s+1], key rows cuSeqlensK[s] ..
 * cuSeqlensK[s+1]; m_s <= n_s (m_s < n_s: the sequence's queries are the last m_s of its n_s
 * positions, chunked prefill over its KV prefix; m_s = 0: a sequence with no queries in this
 * batch, which gets no rows and runs nothing). Output [Mq, H, d], LSE [H, Mq].
 */
import { attentionShape, assertBlockSize, numBlocks, type AttentionShape } from './attention.js';
import type { AttentionResult, Backend, DeviceMark, VarlenAttentionOptions, VarlenBatch, VarlenSegment } from './backend.js';
import { InvalidArgumentError, ShapeError, UnsupportedError, assertKnownKeys, describeValue, errorWithin } from './errors.js';
import { causalBlockCount, validateMask, type ValidateMaskOptions } from './mask.js';
import { type BuiltPlan, buildPlan, densePlan } from './plan/build.js';
import { releasePlan } from './prefill.js';
import type { PlanOptions, PrefillInputs, PrefillPlan } from './plan/types.js';
import type { Policy } from './policy.js';
import type { DeviceTensor } from './tensor.js';
import { assertBackend, assertCallOptions, assertInputs, assertOut } from './validate.js';

/** Where the sequences of a packed batch start and end (FlashAttention's `cu_seqlens`). */
export interface VarlenLayout {
  /** [S + 1] query row offsets: 0, then each sequence's end; the last is q's row count */
  readonly cuSeqlensQ: ArrayLike<number>;
  /** [S + 1] key row offsets into k and v; default `cuSeqlensQ` (every sequence a full prefill) */
  readonly cuSeqlensK?: ArrayLike<number>;
}

/** Read a cu_seqlens array: integers from 0, non-decreasing, ending at `total`. */
function offsets(x: unknown, what: string, total: number): number[] {
  if (!x || typeof x !== 'object' || typeof (x as ArrayLike<number>).length !== 'number') {
    throw new InvalidArgumentError(`${what} must be an array of row offsets [S + 1] (0, then each sequence's end); got ${describeValue(x)}`);
  }
  const a = Array.from(x as ArrayLike<number>);
  if (a.length < 2) throw new InvalidArgumentError(`${what} needs at least two entries (0 and the end of the first sequence); got ${a.length}`);
  for (let i = 0; i < a.length; i++) {
    if (!Number.isSafeInteger(a[i]) || a[i] < 0) throw new InvalidArgumentError(`${what}[${i}] must be a non-negative integer; got ${describeValue(a[i])}`);
    if (i > 0 && a[i] < a[i - 1]) throw new InvalidArgumentError(`${what} must not decrease; entry ${i} is ${a[i]} after ${a[i - 1]}`);
  }
  if (a[0] !== 0) throw new InvalidArgumentError(`${what}[0] must be 0; got ${a[0]}`);
  if (a[a.length - 1] !== total) {
    throw new ShapeError(`${what} ends at ${a[a.length - 1]} but the packed tensor has ${total} rows; the last offset must equal the row count`);
  }
  return a;
}

/**
 * The segments of a layout over packed tensors with `queryRows` and `keyRows` rows, one per
 * sequence. Every sequence needs 0 <= m_s <= n_s; an empty one (m_s = 0, as FlashAttention's
 * cu_seqlens allow, with or without cached keys) gets a segment with `queries: 0`, which
 * `varlenPrefill` neither plans nor hands to the backend (a backend batch holds only segments
 * with queries). Throws INVALID_ARGUMENT or SHAPE_MISMATCH naming the sequence.
 */
export function varlenSegments(layout: VarlenLayout, queryRows: number, keyRows: number): VarlenSegment[] {
  if (!layout || typeof layout !== 'object') {
    throw new InvalidArgumentError(`the varlen layout must be an object { cuSeqlensQ, cuSeqlensK? }; got ${describeValue(layout)}`);
  }
  assertKnownKeys(layout, ['cuSeqlensQ', 'cuSeqlensK'], 'the varlen layout');
  const cq = offsets(layout.cuSeqlensQ, 'cuSeqlensQ', queryRows);
  const ck = layout.cuSeqlensK === undefined ? cq : offsets(layout.cuSeqlensK, 'cuSeqlensK', keyRows);
  if (layout.cuSeqlensK === undefined && queryRows !== keyRows) {
    throw new ShapeError(`q has ${queryRows} rows and k ${keyRows}: pass cuSeqlensK for the keys (chunked sequences)`);
  }
  if (ck.length !== cq.length) {
    throw new ShapeError(`cuSeqlensQ describes ${cq.length - 1} sequences and cuSeqlensK ${ck.length - 1}; they must agree`);
  }
  const segs: VarlenSegment[] = [];
  for (let s = 0; s + 1 < cq.length; s++) {
    const m = cq[s + 1] - cq[s];
    const n = ck[s + 1] - ck[s];
    if (m > n) throw new ShapeError(`sequence ${s} has ${m} query rows but ${n} key rows; queries are the last m of a sequence's n positions`);
    segs.push({ qStart: cq[s], queries: m, kStart: ck[s], keys: n });
  }
  return segs;
}

/**
 * An error raised while working on one sequence's slices, with the sequence named: its rows
 * in the packed tensors come first in the message, since a row or index in the error is the
 * slice's own (a CrispError keeps its code, class and details, adds `sequence`, and is the cause).
 * Anything else passes through unchanged.
 */
export function inSequence(e: unknown, s: number, seg: VarlenSegment, entry: string): unknown {
  const where = `sequence ${s} (packed q rows [${seg.qStart}, ${seg.qStart + seg.queries}), k rows [${seg.kStart}, ${seg.kStart + seg.keys}); rows below count from its first)`;
  return errorWithin(e, `${entry}: ${where}`, { sequence: s });
}

/** The shape of sequence `s` of a batch (its slice of q, k, v). */
export function segmentShape(shape: AttentionShape, seg: VarlenSegment): AttentionShape {
  return { ...shape, queries: seg.queries, keys: seg.keys };
}

/** What `varlenPrefill` returns: the packed output and one complete plan per sequence. */
export interface VarlenPrefillResult extends AttentionResult {
  /** per sequence, in order (an empty sequence's with `queries: 0`) */
  readonly segments: readonly VarlenSegment[];
  /**
   * per sequence, in order; each plan's prepared mask released. An empty sequence's plan is
   * dense with `denseReason: 'empty'` (nothing planned, nothing run).
   */
  readonly plans: readonly PrefillPlan[];
  /** selected causal blocks over all non-empty sequences' causal blocks (dense sequences count fully) */
  readonly overallDensity: number;
  /**
   * Milliseconds: planMs from the call until the attention was queued (every sequence's
   * plan), attentionMs from there until the output is ready (on a backend with `mark`, the
   * device timeline), totalMs the host wall clock of the whole call.
   */
  readonly timings: { readonly planMs: number; readonly attentionMs: number; readonly totalMs: number };
}

/** sparsePrefill's options; `out` is the packed [Mq, H, d] output. */
export type VarlenPrefillOptions = PlanOptions & VarlenAttentionOptions;

/**
 * Plan and run a ragged batch: every sequence planned on its own over slices of the packed
 * tensors (`Backend.sliceRows`), then the whole batch's attention in one
 * `Backend.varlenAttention` call; sequences whose plan is dense (below the length gate, say)
 * run dense inside the same call. The output stays on the backend.
 */
export async function varlenPrefill(
  backend: Backend,
  inputs: PrefillInputs,
  layout: VarlenLayout,
  policy: Policy,
  opts: VarlenPrefillOptions = {},
): Promise<VarlenPrefillResult> {
  assertBackend(backend, 'varlenPrefill');
  assertInputs(inputs, backend, 'varlenPrefill', true);
  assertCallOptions(opts, 'varlenPrefill');
  opts ??= {};
  if (typeof backend.varlenAttention !== 'function' || typeof backend.sliceRows !== 'function') {
    throw new UnsupportedError(`varlenPrefill: backend ${backend.name} has no varlenAttention/sliceRows; run the sequences one by one with sparsePrefill`, {
      limit: 'varlen',
    });
  }
  // (m <= n for the packed tensors is not required: a chunked sequence may sit beside others)
  const shape = packedShape(inputs);
  const segments = varlenSegments(layout, shape.queries, shape.keys);
  // the sequences with queries: planned and run (q has rows, so there is at least one)
  const live = segments.filter((g) => g.queries > 0);
  assertOut(opts.out, inputs, shape, backend, 'varlenPrefill');
  const m0 = backend.mark?.();
  const t0 = performance.now();
  const plans: PrefillPlan[] = [];
  const { out: _out, returnLse: _lse, ...planOpts } = opts;
  let result: AttentionResult;
  let m1: DeviceMark | undefined;
  let t1: number;
  try {
    // Every sequence's plan is queued before any is read back: a device planner's work for
    // all of them runs back to back, and the host waits once instead of once a sequence.
    // (The slices stay alive until the plans are read: a device plan reads q and k until then.)
    const slices: DeviceTensor[] = [];
    const built: BuiltPlan[] = [];
    try {
      for (const seg of live) {
        const q = backend.sliceRows(inputs.q, seg.qStart, seg.queries);
        slices.push(q);
        const k = backend.sliceRows(inputs.k, seg.kStart, seg.keys);
        slices.push(k);
        try {
          built.push(await buildPlan(backend, { q, k }, policy, planOpts, false));
        } catch (e) {
          throw inSequence(e, segments.indexOf(seg), seg, 'varlenPrefill');
        }
      }
      for (let s = 0; s < built.length; s++) {
        const b = built[s];
        plans.push('ready' in b ? b.ready : await b.queued.finish(false));
      }
    } catch (e) {
      // the plans not read back yet still hold their device masks
      for (let s = plans.length; s < built.length; s++) {
        const b = built[s];
        if ('queued' in b) b.queued.prepared.release();
      }
      throw e;
    } finally {
      for (const t of slices) t.dispose();
    }
    const B = plans.find((p) => p.mask)?.blockSize ?? plans[0].blockSize;
    assertBlockSize(B, backend.capabilities.blockSizes);
    const batch: VarlenBatch = {
      blockSize: B,
      segments: live,
      masks: plans.map((p) => p.mask),
      prepared: plans.map((p) => (p.prepared && !p.prepared.released ? p.prepared : undefined)),
    };
    m1 = m0 ? backend.mark?.() : undefined;
    t1 = performance.now();
    const attnOpts: VarlenAttentionOptions = { scale: opts.scale, returnLse: opts.returnLse, out: opts.out };
    result = await backend.varlenAttention(inputs.q, inputs.k, inputs.v, batch, attnOpts);
    await backend.synchronize();
  } finally {
    for (const p of plans) releasePlan(p);
  }
  const m2 = m1 ? backend.mark?.() : undefined;
  const t2 = performance.now();
  const released = plans.map(({ prepared: _p, ...rest }) => rest as PrefillPlan);
  let selected = 0;
  let causal = 0;
  for (const p of released) {
    const c = causalBlockCount(p.numBlocks) * p.shape.heads;
    causal += c;
    selected += p.overallDensity * c;
  }
  // one plan per sequence, in order: an empty sequence's is dense and empty
  let next = 0;
  const perSequence = segments.map((g) =>
    g.queries > 0 ? released[next++] : densePlan(policy, segmentShape(shape, g), released[0].blockSize, 'empty', performance.now()),
  );
  const timings =
    m0 && m1 && m2
      ? { planMs: m1.msSince(m0), attentionMs: m2.msSince(m1), totalMs: t2 - t0 }
      : { planMs: t1 - t0, attentionMs: t2 - t1, totalMs: t2 - t0 };
  return { ...result, segments, plans: perSequence, overallDensity: causal > 0 ? selected / causal : 1, timings };
}

/**
 * The packed tensors' shape: q [Mq, H, d], k and v [Nk, Hkv, d] agreeing in dtype, heads and
 * head dim (Mq > Nk is allowed here; each sequence's m_s <= n_s is checked by its segment).
 */
export function packedShape(inputs: PrefillInputs): AttentionShape {
  const { q, k, v } = inputs;
  if (q.shape.length === 3 && k.shape.length === 3 && q.shape[0] > k.shape[0]) {
    // attentionShape refuses m > n; check the rest with a q of k's rows
    const s = attentionShape({ dtype: q.dtype, shape: [k.shape[0], q.shape[1], q.shape[2]] }, k, v);
    return { ...s, queries: q.shape[0] };
  }
  return attentionShape(q, k, v);
}

/**
 * Check a batch against the packed shape before any work (every backend's varlenAttention
 * runs this): integer segments inside the packed rows, 1 <= m_s <= n_s, query ranges in
 * order and disjoint (each output row is written once; key ranges may overlap), one mask (or
 * undefined) per segment over its own ceil(n_s / B) key blocks, `prepared` as long as the
 * segments. `maskOptions` passes through to validateMask (a GPU backend may check the rows'
 * entries on the device).
 */
export function assertVarlenBatch(
  batch: unknown,
  shape: AttentionShape,
  blockSizes: readonly number[],
  maskOptions: Omit<ValidateMaskOptions, 'firstQueryBlock'> = {},
): asserts batch is VarlenBatch {
  if (!batch || typeof batch !== 'object') {
    throw new InvalidArgumentError(`varlenAttention needs a batch { blockSize, segments, masks }; got ${describeValue(batch)}`);
  }
  const b = batch as Partial<VarlenBatch>;
  assertBlockSize(b.blockSize, blockSizes);
  const B = b.blockSize;
  if (!Array.isArray(b.segments) || b.segments.length < 1) {
    throw new InvalidArgumentError(`batch.segments must be a non-empty array of { qStart, queries, kStart, keys }; got ${describeValue(b.segments)}`);
  }
  const S = b.segments.length;
  if (!Array.isArray(b.masks) || b.masks.length !== S) {
    throw new InvalidArgumentError(`batch.masks must hold one mask (or undefined: dense) per segment (${S}); got ${describeValue(b.masks)}`);
  }
  if (b.prepared !== undefined && (!Array.isArray(b.prepared) || b.prepared.length !== S)) {
    throw new InvalidArgumentError(`batch.prepared must hold one entry (or undefined) per segment (${S}); got ${describeValue(b.prepared)}`);
  }
  let qEnd = 0;
  for (let s = 0; s < S; s++) {
    const g = b.segments[s] as Partial<VarlenSegment> | null;
    const ok = (x: unknown): x is number => Number.isSafeInteger(x) && (x as number) >= 0;
    if (!g || typeof g !== 'object' || !ok(g.qStart) || !ok(g.queries) || !ok(g.kStart) || !ok(g.keys)) {
      throw new InvalidArgumentError(`batch.segments[${s}] must have non-negative integer qStart, queries, kStart, keys; got ${describeValue(g)}`);
    }
    if (g.queries < 1 || g.queries > g.keys) {
      throw new ShapeError(`batch.segments[${s}] has ${g.queries} query rows and ${g.keys} key rows; it needs 1 <= queries <= keys`);
    }
    if (g.qStart < qEnd) {
      throw new ShapeError(`batch.segments[${s}] starts at query row ${g.qStart}, inside the previous segment (ending at ${qEnd}); query ranges must be in order and disjoint`);
    }
    qEnd = g.qStart + g.queries;
    if (qEnd > shape.queries) throw new ShapeError(`batch.segments[${s}] ends at query row ${qEnd}; q has ${shape.queries}`);
    if (g.kStart + g.keys > shape.keys) throw new ShapeError(`batch.segments[${s}] ends at key row ${g.kStart + g.keys}; k has ${shape.keys}`);
    const mask = b.masks[s];
    if (mask !== undefined) {
      const firstQueryBlock = Math.floor((g.keys - g.queries) / B);
      validateMask(mask, { heads: shape.heads, numBlocks: numBlocks(g.keys, B), blockSize: B }, { ...maskOptions, firstQueryBlock });
    }
  }
}
