/**
 * The main job: one layer's prefill through a backend with a policy, against dense on the
 * same backend in the same process. Inputs are a synthetic scenario (@crisp/synth) or a
 * Q/K/V dump (@crisp/io). Reports per head: route and routing score, density, mass recall,
 * output error; overall: the same plus needle recall, routing agreement and times.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d], B block size, Nb = ceil(n / B).
 */
import {
  type Backend,
  type BlockRows,
  CrispError,
  isCrispError,
  type DeviceTensor,
  type DType,
  expandToRows,
  f16BitsToF32,
  bf16BitsToF32,
  type HostTensor,
  type Policy,
  type PrefillPlan,
  type ProxyStats,
  sparsePrefill,
  headSlice,
} from '@crisp/core';
import { cStruct, jsDistance, jsd, routingAgreement } from '@crisp/router';
import { type GroundTruth, type HeadKind, needleRecall } from '@crisp/synth';
import { type BackendChoice, selectBackend } from './backends.js';
import type { CliIo } from './cli-io.js';
import { type Inputs, type ScenarioFlags, loadInputs, toF32 } from './inputs.js';
import type { QkvNameFlags } from './options.js';
import { type PolicyOverrides, buildPolicy } from './policy.js';
import { progressBar } from './progress.js';

/** The backend and scenario a command runs on (shared by run, report and calibrate). */
export interface ScenarioChoice extends ScenarioFlags {
  readonly backend: BackendChoice;
}

export interface RunOptions extends ScenarioChoice {
  readonly preset: string;
  readonly overrides: PolicyOverrides;
  /** extra presets run on the same inputs (the report compares them) */
  readonly compare?: readonly string[];
  readonly qkv?: string;
  readonly layout?: string;
  /** tensor names (safetensors) or file stems (.npy directory) for q, k, v */
  readonly names?: QkvNameFlags;
  /** what '<u2' .npy arrays hold */
  readonly npyUint16?: 'bf16';
  /** query rows sampled for mass recall (default 64 on the reference, 16 on GPUs) */
  readonly sampleRows?: number;
  /** timed runs after the warm-up (default 3 on GPUs, 1 on the reference) */
  readonly repeats?: number;
  /** apply the backend's dense/sparse length gate (default true) */
  readonly gate: boolean;
  /** run the dense baseline (default true); without it there is no output error or speedup */
  readonly dense?: boolean;
}

export interface HeadResult {
  readonly head: number;
  readonly kind?: HeadKind;
  readonly route: 'vs' | 'pe' | 'dense';
  /** the router's score (C_struct or JSD distance); null for dense plans */
  readonly score: number | null;
  readonly density: number;
  readonly massRecall: number;
  /** ‖O_sparse − O_dense‖ / ‖O_dense‖; null when the dense baseline was skipped (--no-dense) */
  readonly outputError: number | null;
}

export interface PolicyResult {
  readonly policy: string;
  readonly denseReason?: string;
  readonly scoreName?: string;
  readonly threshold?: number;
  readonly heads: readonly HeadResult[];
  readonly density: number;
  readonly massRecall: number;
  /** null when the dense baseline was skipped */
  readonly outputError: number | null;
  readonly needleRecall?: { readonly recall: number; readonly visibleRecall: number; readonly recalled: number; readonly total: number };
  /** C_struct vs JSD decisions on this plan's proxy statistics */
  readonly routingAgreement?: number;
  readonly timeMs: { readonly median: number; readonly runs: readonly number[]; readonly planMs: number };
  /** dense median / this median; null when the dense baseline was skipped */
  readonly speedup: number | null;
  /** selected key blocks per (head, query block), for the report's heatmaps */
  readonly rows?: BlockRows;
}

export interface RunSummary {
  readonly backend: string;
  readonly backendNotes: readonly string[];
  readonly input: {
    readonly source: string;
    readonly profile?: string;
    readonly seed?: number;
    readonly n: number;
    readonly heads: number;
    readonly kvHeads: number;
    readonly headDim: number;
    readonly dtype: DType;
  };
  readonly blockSize: number;
  readonly numBlocks: number;
  readonly sampleRows: number;
  /** the dense baseline; null when it was skipped (--no-dense) */
  readonly dense: { readonly timeMs: { readonly median: number; readonly runs: readonly number[] } } | null;
  readonly policies: readonly PolicyResult[];
  /** proxy statistics of the first sparse plan (for reports): per head p_v, C_struct, JSD */
  readonly proxy?: {
    readonly verticalBlocks: readonly (readonly number[])[];
    readonly cStruct: readonly number[];
    readonly jsd: readonly number[];
  };
  readonly truth?: Pick<GroundTruth, 'heads' | 'needles'>;
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** Evenly spaced rows, always including the last; at most `count`. */
function sampleRowsOf(n: number, count: number): number[] {
  if (count >= n) return Array.from({ length: n }, (_, i) => i);
  const rows = new Set<number>();
  for (let t = 0; t < count; t++) rows.add(Math.round(((t + 1) * (n - 1)) / count));
  return [...rows].sort((a, b) => a - b);
}

/**
 * Exact attention probabilities of sampled rows (float64 over f32 inputs), reduced to block
 * masses: [rows][H][Nb]. Shared by every policy's mass recall.
 */
async function sampledBlockMasses(inp: Inputs, kHost: HostTensor, rows: number[], B: number, io: CliIo): Promise<Float64Array[]> {
  const { n, H, Hkv, d } = inp;
  const Nb = Math.ceil(n / B);
  const k = toF32(kHost);
  const scale = 1 / Math.sqrt(d);
  const group = H / Hkv;
  const logits = new Float64Array(n);
  const out: Float64Array[] = [];
  const bar = progressBar(io.stderr, 'mass recall (exact rows)', rows.length);
  try {
    for (let r = 0; r < rows.length; r++) {
      const i = rows[r];
      const q = await inp.qRow(i);
      const masses = new Float64Array(H * Nb);
      for (let h = 0; h < H; h++) {
        const g = Math.floor(h / group);
        const qo = h * d;
        let max = Number.NEGATIVE_INFINITY;
        for (let j = 0; j <= i; j++) {
          const ko = (j * Hkv + g) * d;
          let s = 0;
          for (let c = 0; c < d; c++) s += q[qo + c] * k[ko + c];
          s *= scale;
          logits[j] = s;
          if (s > max) max = s;
        }
        let z = 0;
        for (let j = 0; j <= i; j++) {
          const e = Math.exp(logits[j] - max);
          z += e;
          masses[h * Nb + Math.floor(j / B)] += e;
        }
        for (let J = 0; J < Nb; J++) masses[h * Nb + J] /= z;
      }
      out.push(masses);
      bar.update(r + 1);
      if (r % 4 === 3) await new Promise<void>((res) => setImmediate(res));
    }
  } finally {
    bar.stop();
  }
  return out;
}

function massRecallOf(rows: BlockRows | undefined, masses: Float64Array[], sample: number[], H: number, Nb: number, B: number): Float64Array {
  const per = new Float64Array(H);
  if (!rows) return per.fill(1);
  for (let r = 0; r < sample.length; r++) {
    const I = Math.floor(sample[r] / B);
    for (let h = 0; h < H; h++) {
      const row = h * Nb + I;
      let s = 0;
      for (let p = rows.rowPtr[row]; p < rows.rowPtr[row + 1]; p++) s += masses[r][h * Nb + rows.cols[p]];
      per[h] += s;
    }
  }
  for (let h = 0; h < H; h++) per[h] /= sample.length;
  return per;
}

/** ‖a − b‖ / ‖b‖ per head over all rows, decoding as it goes (no second full f32 copy). */
function relativeErrorPerHead(a: HostTensor, b: HostTensor, H: number, d: number): { perHead: Float64Array; overall: number } {
  const conv = a.dtype === 'f32' ? (x: number) => x : a.dtype === 'bf16' ? bf16BitsToF32 : f16BitsToF32;
  const diff = new Float64Array(H);
  const ref = new Float64Array(H);
  const len = a.data.length;
  for (let f = 0; f < len; f++) {
    const h = Math.floor(f / d) % H;
    const x = conv(a.data[f]);
    const y = conv(b.data[f]);
    diff[h] += (x - y) * (x - y);
    ref[h] += y * y;
  }
  let sx = 0;
  let sy = 0;
  const perHead = new Float64Array(H);
  for (let h = 0; h < H; h++) {
    perHead[h] = ref[h] > 0 ? Math.sqrt(diff[h] / ref[h]) : diff[h] === 0 ? 0 : Number.POSITIVE_INFINITY;
    sx += diff[h];
    sy += ref[h];
  }
  return { perHead, overall: sy > 0 ? Math.sqrt(sx / sy) : 0 };
}

async function timed<T extends { output: DeviceTensor }>(
  backend: Backend,
  warm: boolean,
  repeats: number,
  once: () => Promise<T>,
): Promise<{ last: T; runs: number[] }> {
  if (warm) {
    const w = await once();
    await backend.synchronize();
    w.output.dispose();
  }
  const runs: number[] = [];
  let last: T | undefined;
  for (let r = 0; r < repeats; r++) {
    if (last) last.output.dispose();
    await backend.synchronize();
    const t0 = performance.now();
    last = await once();
    await backend.synchronize();
    runs.push(performance.now() - t0);
  }
  return { last: last!, runs };
}

export async function runJob(o: RunOptions, io: CliIo): Promise<RunSummary> {
  const policies: Policy[] = [buildPolicy(o.preset, o.overrides)];
  for (const c of o.compare ?? []) if (c !== o.preset) policies.push(buildPolicy(c, { blockSize: o.overrides.blockSize }));
  const sel = await selectBackend(o.backend);
  const backend = sel.backend;
  for (const note of sel.notes) io.stderr.write(`note: ${note}\n`);
  const gpu = sel.name !== 'reference';
  const repeats = o.repeats ?? (gpu ? 3 : 1);
  const sampleCount = o.sampleRows ?? (gpu ? 16 : 64);
  let inp: Inputs;
  try {
    inp = await loadInputs(
      sel,
      { ...o, blockSize: o.overrides.blockSize ?? 128, sampleRows: sampleCount, policies: policies.length },
      io,
    );
  } catch (e) {
    backend.dispose();
    throw e;
  }
  const disposeAll: DeviceTensor[] = [inp.q, inp.k, inp.v];
  try {
    const { n, H, d } = inp;
    const B = o.overrides.blockSize ?? 128;
    const Nb = Math.ceil(n / B);
    const inputs = { q: inp.q, k: inp.k, v: inp.v };

    let dense: RunSummary['dense'] = null;
    let denseOut: HostTensor | undefined;
    if (o.dense !== false) {
      const denseBar = progressBar(io.stderr, 'dense baseline', repeats + (gpu ? 1 : 0));
      let denseDone = 0;
      const runs = await timed(backend, gpu, repeats, async () => {
        const r = await backend.denseAttention(inp.q, inp.k, inp.v);
        denseBar.update(++denseDone);
        return r;
      });
      denseBar.stop();
      denseOut = await backend.download(runs.last.output);
      runs.last.output.dispose();
      dense = { timeMs: { median: median(runs.runs), runs: runs.runs } };
    }

    const sample = sampleRowsOf(n, sampleCount);
    const kHost = await backend.download(inp.k);
    const masses = await sampledBlockMasses(inp, kHost, sample, B, io);

    const results: PolicyResult[] = [];
    let proxy: RunSummary['proxy'];
    for (const policy of policies) {
      const bar = progressBar(io.stderr, `${policy.name}`, repeats + (gpu ? 1 : 0));
      let done = 0;
      const sp = await timed(backend, gpu, repeats, async () => {
        const r = await sparsePrefill(backend, inputs, policy, { minSparseLength: o.gate ? undefined : 0 });
        bar.update(++done);
        return r;
      });
      bar.stop();
      const plan: PrefillPlan = sp.last.plan;
      const out = await backend.download(sp.last.output);
      sp.last.output.dispose();
      const rows = plan.mask ? expandToRows(plan.mask) : undefined;
      const recall = massRecallOf(rows, masses, sample, H, Nb, B);
      const err = denseOut ? relativeErrorPerHead(out, denseOut, H, d) : undefined;
      const stats: ProxyStats | undefined = plan.stats;
      if (stats && !proxy) proxy = proxyView(stats);
      const heads: HeadResult[] = [];
      for (let h = 0; h < H; h++) {
        heads.push({
          head: h,
          kind: inp.scenario?.truth.heads[h].kind,
          route: plan.routing ? plan.routing.routes[h] : 'dense',
          score: plan.routing ? plan.routing.scores[h] : null,
          density: plan.density[h],
          massRecall: recall[h],
          outputError: err ? err.perHead[h] : null,
        });
      }
      const nr = inp.scenario ? needleRecall(plan, inp.scenario.truth) : undefined;
      let agreement: number | undefined;
      if (stats) agreement = routingAgreement(cStruct({ tauProxy: o.overrides.tauProxy ?? 0.2 }).route(stats), jsd({ tau: 0.1 }).route(stats));
      const med = median(sp.runs);
      results.push({
        policy: policy.name,
        denseReason: plan.denseReason,
        scoreName: plan.routing?.scoreName,
        threshold: plan.routing?.threshold,
        heads,
        density: plan.overallDensity,
        massRecall: recall.reduce((s, x) => s + x, 0) / H,
        outputError: err ? err.overall : null,
        needleRecall: nr && { recall: nr.recall, visibleRecall: nr.visibleRecall, recalled: nr.recalled, total: nr.total },
        routingAgreement: agreement,
        timeMs: { median: med, runs: sp.runs, planMs: plan.planMs },
        speedup: dense ? dense.timeMs.median / med : null,
        rows,
      });
    }
    return {
      backend: sel.name,
      backendNotes: sel.notes,
      input: {
        source: inp.source,
        profile: inp.scenario?.profile,
        seed: inp.scenario?.seed,
        n,
        heads: H,
        kvHeads: inp.Hkv,
        headDim: d,
        dtype: inp.dtype,
      },
      blockSize: B,
      numBlocks: Nb,
      sampleRows: sample.length,
      dense,
      policies: results,
      proxy,
      truth: inp.scenario ? { heads: inp.scenario.truth.heads, needles: inp.scenario.truth.needles } : undefined,
    };
  } catch (e) {
    throw overflowHint(e, inp);
  } finally {
    for (const t of disposeAll) t.dispose();
    await inp.close();
    backend.dispose();
  }
}

/** An Infinity that --dtype f16 made (values beyond ±65504) is the flag's doing, not the file's. */
function overflowHint(e: unknown, inp: Inputs): unknown {
  if (!isCrispError(e, 'NON_FINITE') || inp.dtype !== 'f16' || !inp.convertedFrom || !/Infinity/.test(e.message)) return e;
  return new CrispError(
    'NON_FINITE',
    `${e.message} (${inp.source} holds ${inp.convertedFrom} values and --dtype f16 turns those beyond ±65504 into Infinity: pass --dtype bf16 or f32)`,
    e.details,
  );
}

function proxyView(stats: ProxyStats): NonNullable<RunSummary['proxy']> {
  const { heads: H, numBlocks: Nb } = stats;
  const verticalBlocks: number[][] = [];
  const js: number[] = [];
  for (let h = 0; h < H; h++) {
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    verticalBlocks.push(Array.from(pv));
    js.push(jsDistance(headSlice(stats.pooledEstimate, h, Nb), pv));
  }
  return { verticalBlocks, cStruct: Array.from(stats.cStruct), jsd: js };
}
