/**
 * The conformance cases: every backend primitive and the full pipeline, each checked
 * against @crisp/reference on fresh seeded inputs. Cases are plain data + an async `run`,
 * so the same list drives the programmatic runner (plain Node, no test framework) and the
 * vitest layer (one `it` per case).
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import {
  type BlockRows,
  type DType,
  type DeviceTensor,
  type AttentionResult,
  assertFiniteStats,
  type HostTensor,
  hostTensor,
  type ProxyStats,
  isCrispError,
  type Policy,
  expandToRows,
  numBlocks,
  planPrefill,
  sparsePrefill,
  toFloat32,
  vsHead,
} from '@crisp/core';
import { pooledBlockMap, } from '@crisp/reference';
import {
  compareRoutes,
  comparePeRows,
  compareSelection,
  compareStats,
} from './compare.js';
import { type Rng, attentionInputs } from './random.js';

export * from './case-support.js';
import { devicePlanCoverageCase } from './device-coverage-cases.js';
import { deviceSelectCase, devicePlanCase } from './device-plan-cases.js';
import {
  bitEqual,
  type ConformanceCase,
  type ShapeCase,
  checkAttention,
  makeCase,
  outcome,
  poisoned,
  randomMask,
  sameRows,
  shapeName,
  upload,
} from './case-support.js';

/**
 * Default shapes: n not a multiple of B, n < 2B, GQA ratios 1, 4 and 8, d 64 and 128,
 * B 64 and 128, chunked prefill (q the last m of n positions: a chunk starting inside a
 * block, the last block alone, H/Hkv 32/8, a chunk shorter than a block and than 64 rows, so
 * the proxy rows b = m fill no whole tile), and shapes long enough for the presets' sparse
 * path (n > kMin = 1024), whole and chunked ((p, m) = (n - 300, 300), (1000, 1100)).
 */
export const SMALL_SIZES: readonly ShapeCase[] = Object.freeze([
  { n: 200, heads: 2, kvHeads: 2, headDim: 64, blockSize: 64 },
  { n: 100, heads: 8, kvHeads: 2, headDim: 128, blockSize: 64 },
  { n: 300, heads: 8, kvHeads: 1, headDim: 64, blockSize: 128 },
  { n: 190, m: 70, heads: 4, kvHeads: 2, headDim: 64, blockSize: 64 },
  { n: 320, m: 64, heads: 32, kvHeads: 8, headDim: 64, blockSize: 64 },
  { n: 250, m: 37, heads: 4, kvHeads: 2, headDim: 128, blockSize: 64 },
  { n: 1100, heads: 4, kvHeads: 2, headDim: 64, blockSize: 128, use: 'pipeline' },
  { n: 1100, m: 300, heads: 4, kvHeads: 2, headDim: 64, blockSize: 128, use: 'pipeline' },
  { n: 2100, m: 1100, heads: 8, kvHeads: 8, headDim: 64, blockSize: 128, use: 'pipeline' },
]);

/** Long shapes for GPU backends (n up to 65536); exact checks run on sampled query rows. */
export const LARGE_SIZES: readonly ShapeCase[] = Object.freeze([
  { n: 4000, heads: 8, kvHeads: 2, headDim: 128, blockSize: 64, use: 'both' },
  { n: 16384, heads: 8, kvHeads: 1, headDim: 128, blockSize: 128, use: 'both' },
  { n: 65536, heads: 8, kvHeads: 2, headDim: 128, blockSize: 128, use: 'both' },
  { n: 65000, m: 1000, heads: 8, kvHeads: 2, headDim: 128, blockSize: 128 },
  { n: 16384, m: 128, heads: 32, kvHeads: 8, headDim: 128, blockSize: 128, use: 'both' },
  { n: 16384, m: 3000, heads: 8, kvHeads: 2, headDim: 128, blockSize: 64, use: 'both' },
]);

// ---------------------------------------------------------------------------------------
// the cases

function transferCase(dtype: DType, s: ShapeCase): ConformanceCase {
  return makeCase(`transfer/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const be = ctx.backend;
    const lines: string[] = [];
    const back = await be.download(be.upload(x.k));
    if (back.dtype !== dtype || back.shape.join() !== x.k.shape.join()) lines.push(`download gave ${back.dtype} [${back.shape}]`);
    else if (!bitEqual(back.data, x.k.data)) lines.push('upload then download changed the bits');
    // write() in three uneven chunks into an allocated tensor
    const t = be.allocate(dtype, x.q.shape);
    const len = x.q.data.length;
    const cuts = [0, Math.floor(len / 3) + 1, Math.floor((2 * len) / 3), len];
    for (let c = 0; c < 3; c++) be.write(t, cuts[c], x.q.data.subarray(cuts[c], cuts[c + 1]));
    const w = await be.download(t);
    if (!bitEqual(w.data, x.q.data)) lines.push('allocate + write in chunks + download changed the bits');
    return outcome(lines.length ? 1 : 0, 0, lines);
  });
}

function proxyStatsCase(dtype: DType, s: ShapeCase): ConformanceCase {
  return makeCase(`proxyStats/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const B = s.blockSize;
    // Windows that are not multiples of B, so a kernel that rounds them to blocks is caught.
    const opts = { blockSize: B, wSink: Math.max(1, Math.floor(B * 0.75)), wLocal: B + 5, tokenScores: true };
    const d = upload(ctx.backend, x);
    const ref = await ctx.reference.proxyStats(ctx.reference.upload(x.q), ctx.reference.upload(x.k), opts);
    // With and without token scores: a backend may reduce to block scores by another route
    // when no policy reads the tokens (the CUDA backend does); both must match.
    const got = await ctx.backend.proxyStats(d.q, d.k, opts);
    const c = compareStats(got, ref, ctx.tolerance.stats);
    const blocks = await ctx.backend.proxyStats(d.q, d.k, { ...opts, tokenScores: false });
    const { verticalTokens: _v, slashTokens: _s, ...blockRef } = ref;
    const cb = compareStats(blocks, blockRef, ctx.tolerance.stats);
    // As a device plan asks for them when its router reads no optional statistic (the CUDA
    // backend's lean pass): the optional ones are computed when read, and all must match.
    const lean = await ctx.backend.proxyStats(d.q, d.k, { ...opts, tokenScores: false, deferRead: true, optionalStats: [] });
    await lean.settle?.();
    const cl = compareStats(lean, blockRef, ctx.tolerance.stats);
    // An explicit softmax scale (a model's own, not 1/sqrt(d)): a kernel that ignores it fails.
    const scaled = { ...opts, tokenScores: false, scale: explicitScale(r, s.headDim) };
    const refScaled = await ctx.reference.proxyStats(ctx.reference.upload(x.q), ctx.reference.upload(x.k), scaled);
    const cs = compareStats(await ctx.backend.proxyStats(d.q, d.k, scaled), refScaled, ctx.tolerance.stats);
    return outcome(Math.max(c.error, cb.error, cl.error, cs.error), ctx.tolerance.stats, [
      ...c.lines,
      ...cb.lines.map((l) => `without token scores: ${l}`),
      ...cl.lines.map((l) => `without optional statistics until read: ${l}`),
      ...cs.lines.map((l) => `with scale ${scaled.scale}: ${l}`),
    ]);
  });
}

function peCase(dtype: DType, s: ShapeCase): ConformanceCase {
  return makeCase(`peBlockRows/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const B = s.blockSize;
    // a subset of heads, out of order of kv groups, to catch head-slot mix-ups
    const heads = [...Array(s.heads).keys()].filter((h) => h === 0 || h % 2 === 1);
    const gamma = 0.8 + 0.15 * r();
    // an explicit softmax scale: a kernel that ignores it pools another map
    const scale = explicitScale(r, s.headDim);
    const d = upload(ctx.backend, x);
    const got = await ctx.backend.peBlockRows(d.q, d.k, { blockSize: B, gamma, heads, scale });
    const map = pooledBlockMap(x.q, x.k, B, heads, { scale });
    const c = comparePeRows(got, map, heads, gamma, ctx.tolerance.stats);
    return outcome(c.lines.length ? Number.POSITIVE_INFINITY : 0, ctx.tolerance.stats, c.lines, `${c.borderline} borderline entries`);
  });
}

/**
 * A softmax scale of [0.4, 0.8) / sqrt(d), not the default (models set their own, e.g. YaRN
 * scaling). Below the default, so the dtypes' tolerances (set at the default scale) hold:
 * a larger scale sharpens the softmax and with it the f32 kernels' rounding (at 2.35 / sqrt(d)
 * an f32 WebGPU case reached 2.3e-5 against its 2e-5).
 */
function explicitScale(r: Rng, headDim: number): number {
  return (0.4 + 0.4 * r()) / Math.sqrt(headDim);
}

const FORMS = ['vs', 'rows', 'mixed'] as const;

function expandCase(dtype: DType, s: ShapeCase, form: (typeof FORMS)[number]): ConformanceCase {
  return makeCase(`expandMask/${form}/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const Nb = numBlocks(s.n, s.blockSize);
    const mask = randomMask(r, form, s.heads, Nb, s.blockSize);
    const got = await ctx.backend.expandMask(mask);
    const lines = sameRows(got, expandToRows(mask), s.heads, Nb);
    return outcome(lines.length ? 1 : 0, 0, lines);
  });
}

function sparseCase(dtype: DType, s: ShapeCase, form: (typeof FORMS)[number]): ConformanceCase {
  return makeCase(`sparseAttention/${form}/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const Nb = numBlocks(s.n, s.blockSize);
    const mask = randomMask(r, form, s.heads, Nb, s.blockSize);
    const d = upload(ctx.backend, x);
    const out = poisoned(ctx.backend, dtype, x.q.shape);
    const wantLse = ctx.backend.capabilities.logSumExp;
    // an explicit softmax scale (the default one runs in denseAttention and the pipeline)
    const scale = explicitScale(r, s.headDim);
    const res = await ctx.backend.sparseAttention(d.q, d.k, d.v, mask, { out, returnLse: wantLse, scale });
    if (res.output !== out) {
      return outcome(Number.POSITIVE_INFINITY, ctx.tolerance.output, ['the result is not the tensor passed as opts.out']);
    }
    const output = await ctx.backend.download(res.output);
    const c = await checkAttention(ctx, s, x, output, res.lse, mask, wantLse, scale);
    return { ...c, detail: c.detail.replace(/^([^\n]*)/, `$1; scale ${scale}`) };
  });
}

function denseCase(dtype: DType, s: ShapeCase): ConformanceCase {
  return makeCase(`denseAttention/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const d = upload(ctx.backend, x);
    const out = poisoned(ctx.backend, dtype, x.q.shape);
    const wantLse = ctx.backend.capabilities.logSumExp;
    const res = await ctx.backend.denseAttention(d.q, d.k, d.v, { out, returnLse: wantLse });
    if (res.output !== out) {
      return outcome(Number.POSITIVE_INFINITY, ctx.tolerance.output, ['the result is not the tensor passed as opts.out']);
    }
    const output = await ctx.backend.download(res.output);
    return checkAttention(ctx, s, x, output, res.lse, undefined, wantLse);
  });
}

/**
 * The full pipeline: the backend's plan must match the reference plan up to borderline
 * decisions (see compare.ts), and its output must match exact attention over the
 * backend's OWN mask (so a borderline block never turns into an output failure).
 */
function pipelineCase(dtype: DType, s: ShapeCase, policy: Policy): ConformanceCase {
  const B = policy.blockSize ?? 128;
  const shape = { ...s, blockSize: B };
  return makeCase(`pipeline/${policy.name}/${shapeName(shape)}/${dtype}`, dtype, shape, B, async (ctx, r) => {
    const x = attentionInputs(r, dtype, s);
    const tol = ctx.tolerance;
    const lines: string[] = [];
    const rd = upload(ctx.reference, x);
    const refPlan = await planPrefill(ctx.reference, rd, policy, { minSparseLength: 0 });
    const d = upload(ctx.backend, x);
    const out = poisoned(ctx.backend, dtype, x.q.shape);
    const res = await sparsePrefill(ctx.backend, d, policy, { minSparseLength: 0, out });
    const plan = res.plan;
    if (res.output !== out) lines.push('the result is not the tensor passed as opts.out');
    if (Boolean(plan.mask) !== Boolean(refPlan.mask)) {
      lines.push(`plan is ${plan.mask ? 'sparse' : `dense (${plan.denseReason})`}, reference ${refPlan.mask ? 'sparse' : `dense (${refPlan.denseReason})`}`);
    }
    let borderline = 0;
    if (plan.mask && refPlan.mask && plan.stats && refPlan.stats && plan.routing && refPlan.routing) {
      const st = compareStats(plan.stats, refPlan.stats, tol.stats, true);
      if (!(st.error <= tol.stats)) lines.push(...st.lines.map((l) => `stats: ${l}`));
      const rt = compareRoutes(plan.routing.routes, refPlan.routing.routes, refPlan.routing.scores, refPlan.routing.threshold, 10 * tol.stats);
      lines.push(...rt.lines);
      borderline += rt.flipped.size;
      const Nb = refPlan.numBlocks;
      const H = s.heads;
      const peHeads: number[] = [];
      for (let h = 0; h < H; h++) {
        if (rt.flipped.has(h)) continue; // a borderline route: the whole head may differ
        for (const dir of ['vertical', 'slash'] as const) {
          const scores = (dir === 'vertical' ? refPlan.stats.verticalBlocks : refPlan.stats.slashBlocks).subarray(h * Nb, (h + 1) * Nb);
          const c = compareSelection(vsHead(plan.mask.vs!, h)[dir], vsHead(refPlan.mask.vs!, h)[dir], scores, 2 * tol.stats);
          borderline += c.borderline;
          lines.push(...c.lines.map((l) => `head ${h} ${dir}: ${l}`));
        }
        if (refPlan.routing.routes[h] === 'pe') peHeads.push(h);
      }
      if (peHeads.length > 0) {
        const pick = (rows: BlockRows | undefined): BlockRows => {
          const rowPtr = new Int32Array(peHeads.length * Nb + 1);
          const cols: number[] = [];
          peHeads.forEach((h, slot) => {
            for (let I = 0; I < Nb; I++) {
              if (rows) for (let p = rows.rowPtr[h * Nb + I]; p < rows.rowPtr[h * Nb + I + 1]; p++) cols.push(rows.cols[p]);
              rowPtr[slot * Nb + I + 1] = cols.length;
            }
          });
          return { rowPtr, cols: Int32Array.from(cols) };
        };
        const map = pooledBlockMap(x.q, x.k, B, peHeads);
        const c = comparePeRows(pick(plan.mask.rows), map, peHeads, policy.pe!.gamma, tol.stats);
        borderline += c.borderline;
        lines.push(...c.lines.map((l) => `PE rows: ${l}`));
      }
    }
    const output = await ctx.backend.download(res.output);
    const att = await checkAttention(ctx, s, x, output, undefined, plan.mask, false);
    if (!att.passed) lines.push(...att.detail.split('\n'));
    const checked = att.detail.match(/\d+ of \d+ query rows checked/)?.[0] ?? '';
    const density = `density ${plan.overallDensity.toFixed(4)} (reference ${refPlan.overallDensity.toFixed(4)}), ${borderline} borderline differences, ${checked}`;
    return outcome(att.maxError, tol.output, lines, density);
  });
}

/**
 * A full garbage collection on demand: `gc` when Node runs with --expose-gc, else the V8 flag
 * set now and a fresh context's `gc` (the flag must be set before a context reads `gc`; Node
 * only); undefined where neither exists. Lifetime tests elsewhere use it too.
 */
export async function garbageCollector(): Promise<(() => void) | undefined> {
  const g = (globalThis as { gc?: () => void }).gc;
  if (typeof g === 'function') return g;
  try {
    const v8 = await import('node:v8');
    const vm = await import('node:vm');
    v8.setFlagsFromString('--expose-gc');
    return vm.runInNewContext('gc') as () => void;
  } catch {
    return undefined;
  }
}

/** The held value of the sentinel `collectionReported` registers in a registry. */
export const COLLECTION_SENTINEL = 'sentinel';

/**
 * Runs a full collection (`gc`, from garbageCollector) and waits until `registry` has
 * reported it (`reported()`, which the registry's callback sets when it sees the held value
 * COLLECTION_SENTINEL): a sentinel made and dropped just before is collected by it, and V8
 * reports everything one collection freed from a registry in one cleanup task, so once the
 * sentinel is reported so is the rest. No fixed number of timer turns, which a loaded machine
 * outlasts; false after `timeoutMs` without the report (a hang guard). Lifetime tests
 * elsewhere use it too.
 */
export async function collectionReported(
  gc: () => void,
  registry: FinalizationRegistry<unknown>,
  reported: () => boolean,
  timeoutMs = 60_000,
): Promise<boolean> {
  // (made and dropped in a frame of its own, so nothing on this one keeps it)
  const token = {};
  ((r) => r.register({}, COLLECTION_SENTINEL, token))(registry);
  gc();
  const deadline = Date.now() + timeoutMs;
  while (!reported() && Date.now() < deadline) await new Promise((done) => setTimeout(done, 5));
  // (a use after the wait: a registry collected before it reports never reports)
  registry.unregister(token);
  return reported();
}

/** Prefills a lifetime case runs in one job. */
const LIFETIME_PREFILLS = 8;

/**
 * A loop of awaited prefills, one job as a model's layers are, lets go of every plan it drops:
 * a collection inside the job frees their statistics. (A backend that keeps a WeakRef to each
 * statistics object fails it: V8 keeps a WeakRef's target alive to the end of the job that
 * made it, so such a loop holds every plan's statistics until it returns.)
 */
function lifetimeCase(dtype: DType, s: ShapeCase, policy: Policy): ConformanceCase {
  const B = policy.blockSize ?? 128;
  const shape = { ...s, blockSize: B };
  return makeCase(`pipeline/lifetime/${policy.name}/${shapeName(shape)}/${dtype}`, dtype, shape, B, async (ctx, r) => {
    const gc = await garbageCollector();
    if (!gc) return { passed: true, skipped: 'no way to run a garbage collection here (Node with node:v8 needed)', maxError: 0, tolerance: 0, detail: '' };
    const x = attentionInputs(r, dtype, s);
    const d = upload(ctx.backend, x);
    const out = poisoned(ctx.backend, dtype, x.q.shape);
    // (a FinalizationRegistry, not WeakRefs: a WeakRef here would keep its target to the job's end)
    let collected = 0;
    let reported = false;
    const registry = new FinalizationRegistry((held: number | typeof COLLECTION_SENTINEL) => {
      if (held === COLLECTION_SENTINEL) reported = true;
      else collected++;
    });
    let registered = 0;
    try {
      for (let i = 0; i < LIFETIME_PREFILLS; i++) {
        const res = await sparsePrefill(ctx.backend, d, policy, { minSparseLength: 0, out });
        if (res.plan.stats) {
          registry.register(res.plan.stats, i);
          registered++;
        }
      }
      // collected in this job; the registry reports it in a later task (collectionReported)
      await collectionReported(gc, registry, () => reported);
    } finally {
      out.dispose();
      for (const t of [d.q, d.k, d.v]) t.dispose();
    }
    const lines: string[] = [];
    if (registered < LIFETIME_PREFILLS) lines.push(`${LIFETIME_PREFILLS - registered} of ${LIFETIME_PREFILLS} plans had no statistics (a dense plan?)`);
    // V8 may keep the last one a while (a register, the stack): allow one
    if (!reported) lines.push('the collection was not reported within a minute');
    if (collected < registered - 1) lines.push(`a collection inside the loop freed ${collected} of the ${registered} dropped plans' statistics: something the backend keeps holds them`);
    const info = `${collected} of ${registered} dropped plans' statistics collected inside the loop`;
    return { passed: lines.length === 0, maxError: 0, tolerance: 0, detail: [lines.length === 0 ? `ok; ${info}` : info, ...lines].join('\n') };
  });
}

/** Run `fn` and describe what came back unless it is a CrispError with `code`. */
async function expectCode(what: string, code: string, fn: () => unknown): Promise<string | undefined> {
  try {
    await fn();
  } catch (e) {
    const got = (e as { code?: unknown })?.code;
    if (isCrispError(e) && e.code === code) return undefined;
    return `${what}: expected a CrispError ${code}, got ${isCrispError(e) ? `CrispError ${String(got)}` : String(e)}`;
  }
  return `${what}: expected a CrispError ${code}, nothing was thrown`;
}

/** Bad input gets a typed CrispError with the right code, never a crash or a wrong answer. */
function typedErrorsCase(dtype: DType, s: ShapeCase): ConformanceCase {
  return makeCase(`errors/typed/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const be = ctx.backend;
    const x = attentionInputs(r, dtype, s);
    const d = upload(be, x);
    const B = s.blockSize;
    const Nb = numBlocks(s.n, B);
    const good = randomMask(r, 'rows', s.heads, Nb, B);
    const rows = good.rows!;
    const lines: (string | undefined)[] = [];
    // k and v with a head count that does not divide H
    const badKv = be.upload(attentionInputs(r, dtype, { ...s, kvHeads: s.heads + 1, heads: s.heads + 1 }).k);
    lines.push(await expectCode('H % Hkv != 0', 'SHAPE_MISMATCH', () => be.denseAttention(d.q, badKv, badKv)));
    lines.push(
      await expectCode('mask for the wrong head count', 'INVALID_MASK', () =>
        be.sparseAttention(d.q, d.k, d.v, { ...good, heads: s.heads + 1 }),
      ),
    );
    // a non-causal block: row 0 of head 0 pointing at block 1 (when there is one)
    if (Nb > 1 && rows.rowPtr[1] > 0) {
      const cols = Int32Array.from(rows.cols);
      cols[0] = 1;
      lines.push(
        await expectCode('non-causal mask block', 'INVALID_MASK', () =>
          be.sparseAttention(d.q, d.k, d.v, { ...good, rows: { rowPtr: rows.rowPtr, cols } }),
        ),
      );
    }
    lines.push(
      await expectCode('unsupported block size 48', 'INVALID_ARGUMENT', () =>
        be.proxyStats(d.q, d.k, { blockSize: 48, wSink: 64, wLocal: 64 }),
      ),
    );
    lines.push(
      await expectCode('a negative sink window', 'INVALID_ARGUMENT', () =>
        be.proxyStats(d.q, d.k, { blockSize: s.blockSize, wSink: -1, wLocal: 64 }),
      ),
    );
    lines.push(
      await expectCode('a fractional local window', 'INVALID_ARGUMENT', () =>
        be.proxyStats(d.q, d.k, { blockSize: s.blockSize, wSink: 64, wLocal: 1.5 }),
      ),
    );
    lines.push(
      await expectCode('an unknown optional statistic', 'INVALID_ARGUMENT', () =>
        be.proxyStats(d.q, d.k, { blockSize: s.blockSize, wSink: 64, wLocal: 64, optionalStats: ['entropy' as 'rowEntropy'] }),
      ),
    );
    const gone = be.upload(x.v);
    gone.dispose();
    lines.push(await expectCode('download of a disposed tensor', 'DISPOSED', () => be.download(gone)));
    lines.push(await expectCode('attention on a disposed tensor', 'DISPOSED', () => be.denseAttention(d.q, d.k, gone)));
    const foreign = ctx.reference.upload(x.q);
    lines.push(await expectCode("another backend's tensor", 'WRONG_BACKEND', () => be.denseAttention(foreign, d.k, d.v)));
    const problems = lines.filter((l): l is string => l !== undefined);
    return outcome(problems.length ? 1 : 0, 0, problems);
  });
}

/**
 * NaN / Inf in q, k or v must never be hidden. A backend may throw NON_FINITE at the
 * primitive (the reference does), or let the non-finite value through: proxy statistics
 * that hold it (the pipeline's assertFiniteStats then raises NON_FINITE) or an attention
 * output that holds it. A finite answer from bad input, or another error, fails.
 */
function nonFiniteCase(dtype: DType, s: ShapeCase): ConformanceCase {
  return makeCase(`errors/non-finite/${shapeName(s)}/${dtype}`, dtype, s, s.blockSize, async (ctx, r) => {
    const be = ctx.backend;
    const x = attentionInputs(r, dtype, s);
    const spoil = (t: HostTensor, value: number): DeviceTensor => {
      const vals = toFloat32(t).slice();
      // a key/value row every proxy query sees: the first rows are visible to all later rows
      vals[Math.floor(r() * Math.min(vals.length, 8 * t.shape[1] * t.shape[2]))] = value;
      return be.upload(hostTensor(dtype, t.shape, vals));
    };
    // a value of q's last row: a proxy row, whatever the block size
    const spoilLastQ = (value: number): DeviceTensor => {
      const vals = toFloat32(x.q).slice();
      const row = x.q.shape[1] * x.q.shape[2];
      vals[vals.length - row + Math.floor(r() * row)] = value;
      return be.upload(hostTensor(dtype, x.q.shape, vals));
    };
    const surfaced = async <T>(what: string, fn: () => Promise<T>, visible: (x: T) => boolean | Promise<boolean>) => {
      let got: T;
      try {
        got = await fn();
      } catch (e) {
        if (isCrispError(e, 'NON_FINITE')) return undefined;
        return `${what}: expected NON_FINITE or a non-finite result, got ${isCrispError(e) ? `CrispError ${e.code}` : String(e)}`;
      }
      return (await visible(got)) ? undefined : `${what}: returned a finite result from non-finite input`;
    };
    const statsVisible = (st: ProxyStats) => {
      try {
        assertFiniteStats(st);
        return false;
      } catch (e) {
        return isCrispError(e, 'NON_FINITE');
      }
    };
    const outputVisible = async (res: AttentionResult) => !toFloat32(await be.download(res.output)).every(Number.isFinite);
    const d = upload(be, x);
    const opts = { blockSize: s.blockSize, wSink: 64, wLocal: 64 };
    const lines = [
      await surfaced('NaN in k at proxyStats', () => be.proxyStats(d.q, spoil(x.k, Number.NaN), opts), statsVisible),
      await surfaced('Inf in k at proxyStats', () => be.proxyStats(d.q, spoil(x.k, Number.POSITIVE_INFINITY), opts), statsVisible),
      await surfaced('NaN in a proxy row of q at proxyStats', () => be.proxyStats(spoilLastQ(Number.NaN), d.k, opts), statsVisible),
      await surfaced('-Inf in a proxy row of q at proxyStats', () => be.proxyStats(spoilLastQ(Number.NEGATIVE_INFINITY), d.k, opts), statsVisible),
      await surfaced('NaN in v at denseAttention', () => be.denseAttention(d.q, d.k, spoil(x.v, Number.NaN)), outputVisible),
      await surfaced(
        'Inf in v at sparseAttention',
        () =>
          be.sparseAttention(
            d.q,
            d.k,
            spoil(x.v, Number.POSITIVE_INFINITY),
            randomMask(r, 'vs', s.heads, numBlocks(s.n, s.blockSize), s.blockSize),
          ),
        outputVisible,
      ),
    ].filter((l): l is string => l !== undefined);
    return outcome(lines.length ? 1 : 0, 0, lines);
  });
}

export interface CaseListOptions {
  readonly sizes: readonly ShapeCase[];
  readonly dtypes: readonly DType[];
  readonly policies: readonly Policy[];
}

/** Every case for the given sizes, dtypes and policies, in a stable order. */
export function buildCases(o: CaseListOptions): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  for (const dtype of o.dtypes) {
    o.sizes.forEach((s, i) => {
      const use = s.use ?? 'primitives';
      const chunked = (s.m ?? s.n) !== s.n;
      if (use !== 'pipeline') {
        if (i === 0) out.push(transferCase(dtype, s), typedErrorsCase(dtype, s), nonFiniteCase(dtype, s));
        out.push(proxyStatsCase(dtype, s), peCase(dtype, s), deviceSelectCase(dtype, s), devicePlanCase(dtype, s), devicePlanCase(dtype, s, true), devicePlanCase(dtype, s, true, true));
        out.push(devicePlanCoverageCase(dtype, s));
        // (the mask expansion does not depend on q: once a shape, not again for its chunks)
        if (!chunked) for (const f of FORMS) out.push(expandCase(dtype, s, f));
        for (const f of FORMS) out.push(sparseCase(dtype, s, f));
        out.push(denseCase(dtype, s));
      }
      if (use !== 'primitives') {
        for (const p of o.policies) out.push(pipelineCase(dtype, s, p));
        // once a dtype, on the first shape the pipeline runs on, with the first policy that
        // routes (a sparse plan, so one with statistics)
        const sparse = o.policies.find((p) => p.router !== undefined);
        if (sparse && !chunked && !out.some((c) => c.dtype === dtype && c.name.startsWith('pipeline/lifetime/'))) {
          out.push(lifetimeCase(dtype, s, sparse));
        }
      }
    });
  }
  return out;
}
