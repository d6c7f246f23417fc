/**
 * Parity: CRISP's flexPrefill preset against FlexPrefill's published code on the same tensors
 * (CUDA only). Per (profile, n, seed) the @crisp/synth layer is generated on the backend in
 * bf16; CRISP plans it with the preset (routes: plan.routing.routes; blocks: plan.mask, VS lists
 * and PE rows) and runs it; q, k, v, the sampled query rows and CRISP's output at those rows go
 * to a safetensors file (@crisp/io). The Python peer (apps/bench/peers/flexprefill_peer.py) runs
 * flex_prefill_attention on each file, scores both outputs against float64 dense attention at
 * the same rows, and returns FlexPrefill's routes and block indices per head; this suite
 * compares them (parity-compare.ts): route agreement, Jaccard of the causal block sets,
 * densities, output errors and times.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { type Backend, type DeviceTensor, type HostData, planPrefill, type Route, sparsePrefill } from '@crisp/core';
import { deviceTensorSource, writeSafetensors } from '@crisp/io';
import { flexPrefill, presetByName } from '@crisp/presets';
import { sampleRows } from '@crisp/reference';
import type { ProfileName } from '@crisp/synth';
import type { OpenBackend } from '../backends.js';
import type { Shape } from '../config.js';
import { deadlineReason, message, type SuiteContext, timeLeft } from '../context.js';
import { inputsProgress, latencyInputs } from '../inputs.js';
import { causalDensity, compareLayer, type HeadComparison, type HeadSelection, selectionsFromFlat, selectionsFromMask } from '../parity-compare.js';
import type { PeerNote } from '../peers.js';
import { type Spread, spread } from '../stats.js';

export const FLEXPREFILL_PEER_SCRIPT = 'apps/bench/peers/flexprefill_peer.py';
/** The peer's exit statuses that mean "not installed here" (torch, FlexPrefill's code, CUDA), not a failure. */
export const PEER_ABSENT_STATUS: Readonly<Record<number, string>> = { 3: 'torch, safetensors or numpy missing', 4: "FlexPrefill's code missing or not importable", 5: 'no CUDA device for PyTorch' };
const FLEXPREFILL_HEAD_DIMS = [16, 32, 64, 128];

export interface ParityParams {
  readonly gamma: number;
  readonly tau: number;
  /** tokens (FlexPrefill converts to ceil(min_budget / block_size) blocks per direction) */
  readonly minBudget: number;
  readonly blockSize: number;
}

/**
 * Another preset (CRISP's own, config.parity.presets) on the same layer as FlexPrefill's code:
 * the time, density and output error to set against FlexPrefill's (the comparison a user
 * choosing between them makes; the flexPrefill preset is the port being checked).
 */
export interface ParityOther {
  readonly preset: string;
  /** sparsePrefill, plan and attention, host clock (as oursMs) */
  readonly ms: Spread;
  /** mean over heads of the causal blocks kept */
  readonly density: number;
  /** relative error against float64 dense attention at the sampled rows, scored by the peer */
  readonly relErr?: number;
}

export interface ParityRow {
  readonly backend: string;
  readonly profile: string;
  readonly n: number;
  readonly seed: number;
  readonly numBlocks: number;
  /** ms: sparsePrefill (plan and attention, host clock); FlexPrefill: flex_prefill_attention (CUDA events) */
  readonly oursMs: Spread;
  readonly theirsMs?: Spread;
  /** relative error against float64 dense attention at the sampled rows (both scored by the peer) */
  readonly oursRelErr?: number;
  readonly theirsRelErr?: number;
  readonly oursDensity: number;
  readonly theirsDensity: number;
  /** FlexPrefill's returned ratio (blocks of the full Nb × Nb grid) scaled to the causal grid */
  readonly theirsCausalRatio?: number;
  readonly oursPeHeads: number;
  readonly theirsPeHeads?: number;
  readonly routeAgreement?: number;
  readonly meanJaccard?: number;
  readonly meanJaccardSameRoute?: number;
  readonly meanJaccardOtherRoute?: number;
  readonly meanAbsDensityDiff: number;
  /** FlexPrefill's JSD distance per head (NaN written as null) beside CRISP's */
  readonly theirsJsd?: (number | null)[];
  readonly oursJsd?: number[];
  readonly heads: HeadComparison[];
  /** the other presets on the same layer (absent when config.parity.presets is empty) */
  readonly others?: ParityOther[];
  readonly run?: string;
}

export interface ParityResult {
  readonly shape: Shape;
  readonly params: ParityParams;
  readonly sampledRows: number;
  readonly rows: ParityRow[];
  readonly skipped: { profile?: string; n?: number; seed?: number; reason: string }[];
  readonly notes: PeerNote[];
  /** the peer's torch, Triton, GPU and FlexPrefill source (file, commit, import stand-ins) */
  peer?: Record<string, unknown>;
}

/** The preset's settings in FlexPrefill's terms. */
export function parityParams(): ParityParams {
  const tau = (flexPrefill.router as { tau?: number }).tau ?? 0.1;
  const vs = flexPrefill.vs as { gamma?: number; kMin?: number };
  return { gamma: vs.gamma ?? 0.95, tau, minBudget: vs.kMin ?? flexPrefill.kMin ?? 1024, blockSize: flexPrefill.blockSize ?? 128 };
}

/** --flexprefill-peer / the repository's copy. */
export function resolveFlexPrefillPeer(repoRoot: string | undefined): string | undefined {
  const p = repoRoot ? join(repoRoot, FLEXPREFILL_PEER_SCRIPT) : resolve(FLEXPREFILL_PEER_SCRIPT);
  return existsSync(p) ? p : undefined;
}

interface PeerRun {
  name: string;
  n?: number;
  ms?: number[];
  relErr?: number;
  crispRelErr?: number;
  /** per head, over the sampled rows: FlexPrefill's output's relative error and CRISP's */
  headRelErr?: number[];
  crispHeadRelErr?: number[];
  /** the other presets' outputs (tensors also_<preset>) scored like crisp_out */
  alsoRelErr?: Record<string, number>;
  causalRatio?: number;
  density?: number[];
  routes?: string[];
  jsd?: (number | null)[];
  blocksFile?: string;
  blocksPtr?: number[];
  error?: string;
  skipped?: string;
}

interface PeerCall {
  readonly status: 'ran' | 'absent' | 'failed';
  readonly detail: string;
  readonly command: string;
  readonly result?: { runs: PeerRun[]; [k: string]: unknown };
}

function callPeer(ctx: SuiteContext, script: string, manifest: object, dir: string, timeoutS: number): PeerCall {
  const manifestFile = join(dir, 'manifest.json');
  const outFile = join(dir, 'flexprefill.json');
  writeFileSync(manifestFile, JSON.stringify(manifest));
  const dirArgs = ctx.config.parity.flexprefillDir ? ['--flexprefill-dir', ctx.config.parity.flexprefillDir] : [];
  const args = [script, '--manifest', manifestFile, '--out', outFile, ...dirArgs];
  const command = `python3 ${args.join(' ')}`;
  const r = spawnSync('python3', args, { encoding: 'utf8', timeout: timeoutS * 1000, maxBuffer: 64 * 1024 * 1024 });
  for (const line of (r.stdout ?? '').trim().split('\n').filter(Boolean)) ctx.log(`  flexprefill peer: ${line}`);
  const last = (r.stderr || r.error?.message || '').trim().split('\n').pop() ?? '';
  if (r.status !== null && PEER_ABSENT_STATUS[r.status]) return { status: 'absent', detail: `${PEER_ABSENT_STATUS[r.status]}: ${last}`, command };
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') return { status: 'absent', detail: 'python3 is not installed', command };
  // (a peer stopped at the time limit leaves the inputs it finished in its results file)
  if (!existsSync(outFile)) return { status: 'failed', detail: `the peer wrote no results (exit ${r.status ?? r.signal}): ${last.slice(-600)}`, command };
  const result = JSON.parse(readFileSync(outFile, 'utf8')) as PeerCall['result'];
  return { status: r.status === 0 ? 'ran' : 'failed', detail: r.status === 0 ? '' : `exit ${r.status ?? r.signal}: ${last.slice(-600)}`, command, result };
}

/** Rows `rows` of an [n, H, d] device tensor (one ranged read per row where the backend has `read`). */
async function readRows(b: Backend, t: DeviceTensor, rows: readonly number[]): Promise<HostData> {
  const width = t.shape[1] * t.shape[2];
  const out = new Uint16Array(rows.length * width);
  if (typeof b.read === 'function') {
    for (let i = 0; i < rows.length; i++) out.set((await b.read(t, rows[i] * width, width)) as Uint16Array, i * width);
    return out;
  }
  const all = (await b.download(t)).data as Uint16Array;
  for (let i = 0; i < rows.length; i++) out.set(all.subarray(rows[i] * width, (rows[i] + 1) * width), i * width);
  return out;
}

interface Ours {
  readonly profile: string;
  readonly n: number;
  readonly seed: number;
  readonly numBlocks: number;
  readonly routes: Route[];
  readonly jsd?: number[];
  readonly selections: HeadSelection[];
  readonly ms: Spread;
  readonly others: Omit<ParityOther, 'relErr'>[];
}

/** `reps` timed sparsePrefill calls of `policy` after `warmup` untimed ones, and the last output's rows. */
async function timedRows(b: Backend, inputs: Parameters<typeof sparsePrefill>[1], policy: Parameters<typeof sparsePrefill>[2], rows: number[], warmup: number, reps: number): Promise<{ times: number[]; rows: HostData }> {
  const times: number[] = [];
  let output: DeviceTensor | undefined;
  try {
    for (let i = 0; i < warmup + reps; i++) {
      output?.dispose();
      output = undefined;
      const r = await sparsePrefill(b, inputs, policy, { minSparseLength: 0 });
      output = r.output;
      if (i >= warmup) times.push(r.timings.totalMs);
    }
    return { times, rows: await readRows(b, output!, rows) };
  } finally {
    output?.dispose();
  }
}

/** Plan, time and write one input; returns CRISP's side. */
async function oursOne(ctx: SuiteContext, b: Backend, profile: ProfileName, n: number, seed: number, file: string, rows: number[]): Promise<Ours> {
  const c = ctx.config.parity;
  const label = `parity ${profile} n=${n} seed=${seed}`;
  const inputs = await latencyInputs(b, profile, n, c.shape, 'bf16', seed, Number.POSITIVE_INFINITY, 'synth', inputsProgress(ctx.log, label));
  try {
    const plan = await planPrefill(b, inputs, flexPrefill, { minSparseLength: 0 });
    if (!plan.mask || !plan.routing) throw new Error(`the preset made a dense plan (${plan.denseReason ?? 'no mask'})`);
    const selections = selectionsFromMask(plan.mask);
    const { times, rows: outRows } = await timedRows(b, inputs, flexPrefill, rows, c.warmup, c.reps);
    const { heads: H, headDim: d } = c.shape;
    // CRISP's own presets on the same tensors, their output rows beside flexPrefill's
    const others: Omit<ParityOther, 'relErr'>[] = [];
    const alsoTensors: Record<string, { dtype: 'bf16'; shape: number[]; data: HostData }> = {};
    for (const name of c.presets) {
      const policy = presetByName(name);
      const p = await planPrefill(b, inputs, policy, { minSparseLength: 0 });
      const density = p.mask ? causalDensity(p.numBlocks, selectionsFromMask(p.mask)) : 1;
      const r = await timedRows(b, inputs, policy, rows, c.warmup, c.reps);
      others.push({ preset: name, ms: spread(r.times), density });
      alsoTensors[`also_${name}`] = { dtype: 'bf16', shape: [rows.length, H, d], data: r.rows };
    }
    await writeSafetensors(
      file,
      {
        q: deviceTensorSource(b, inputs.q),
        k: deviceTensorSource(b, inputs.k),
        v: deviceTensorSource(b, inputs.v),
        rows: { dtype: 'i32', shape: [rows.length], data: Int32Array.from(rows) },
        crisp_out: { dtype: 'bf16', shape: [rows.length, H, d], data: outRows },
        ...alsoTensors,
      },
      { metadata: { 'crisp.profile': profile, 'crisp.seed': String(seed), 'crisp.source': inputs.source } },
    );
    const jsd = plan.routing.scoreName === 'JSD distance' ? Array.from(plan.routing.scores) : undefined;
    return { profile, n, seed, numBlocks: plan.numBlocks, routes: [...plan.routing.routes], jsd, selections, ms: spread(times), others };
  } finally {
    inputs.dispose();
  }
}

function compareOne(o: Ours, run: PeerRun): ParityRow {
  let theirsSel: HeadSelection[] | undefined;
  if (run.blocksFile && run.blocksPtr && existsSync(run.blocksFile)) {
    const buf = readFileSync(run.blocksFile);
    theirsSel = selectionsFromFlat(new Int32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength)), run.blocksPtr);
  }
  const cmp = compareLayer(o.numBlocks, { routes: o.routes, selections: o.selections }, theirsSel ? { routes: run.routes, selections: theirsSel } : { routes: run.routes, densities: run.density });
  return {
    backend: 'cuda',
    profile: o.profile,
    n: o.n,
    seed: o.seed,
    numBlocks: o.numBlocks,
    oursMs: o.ms,
    theirsMs: run.ms?.length ? spread(run.ms) : undefined,
    oursRelErr: run.crispRelErr,
    theirsRelErr: run.relErr,
    oursDensity: cmp.oursDensity,
    theirsDensity: cmp.theirsDensity,
    theirsCausalRatio: run.causalRatio,
    oursPeHeads: o.routes.filter((r) => r === 'pe').length,
    theirsPeHeads: run.routes?.filter((r) => r === 'pe').length,
    routeAgreement: cmp.routeAgreement,
    meanJaccard: cmp.meanJaccard,
    meanJaccardSameRoute: cmp.meanJaccardSameRoute,
    meanJaccardOtherRoute: cmp.meanJaccardOtherRoute,
    meanAbsDensityDiff: cmp.meanAbsDensityDiff,
    theirsJsd: run.jsd,
    oursJsd: o.jsd,
    heads: cmp.heads.map((x) => ({
      ...x,
      ...(run.crispHeadRelErr?.[x.head] !== undefined ? { oursRelErr: run.crispHeadRelErr[x.head] } : {}),
      ...(run.headRelErr?.[x.head] !== undefined ? { theirsRelErr: run.headRelErr[x.head] } : {}),
    })),
    ...(o.others.length ? { others: o.others.map((x) => ({ ...x, relErr: run.alsoRelErr?.[x.preset] })) } : {}),
  };
}

export async function paritySuite(ctx: SuiteContext, backends: readonly OpenBackend[], peerScript: string | undefined): Promise<ParityResult> {
  const c = ctx.config.parity;
  const params = parityParams();
  const result: ParityResult = { shape: c.shape, params, sampledRows: c.rows, rows: [], skipped: [], notes: [] };
  const peer = 'flexprefill';
  const stop = (status: PeerNote['status'], detail: string, command?: string): ParityResult => {
    result.notes.push({ backend: 'cuda', peer, status, detail, command });
    result.skipped.push({ reason: detail });
    ctx.log(`  parity: ${status === 'absent' ? 'skipped' : status} (${detail})`);
    return result;
  };
  const ob = backends.find((x) => x.name === 'cuda' && x.backend);
  if (!ob) return stop('absent', "no CUDA backend here (FlexPrefill's kernels are Triton on CUDA; pass --backends cuda on a GPU machine)");
  if (!peerScript) return stop('absent', `peer script ${FLEXPREFILL_PEER_SCRIPT} not found (run from the repository root)`);
  if (!FLEXPREFILL_HEAD_DIMS.includes(c.shape.headDim)) return stop('absent', `head dim ${c.shape.headDim}: FlexPrefill's kernels take ${FLEXPREFILL_HEAD_DIMS.join(', ')}`);
  const b = ob.backend!;
  const base = { gamma: params.gamma, tau: params.tau, min_budget: params.minBudget, block_size: params.blockSize, reps: c.reps, warmup: c.warmup };
  // Probe: the peer with no inputs loads torch, checks CUDA and imports FlexPrefill's code.
  const probeDir = mkdtempSync(join(tmpdir(), 'crisp-parity-'));
  try {
    const p = callPeer(ctx, peerScript, { ...base, inputs: [] }, probeDir, 300);
    if (p.status !== 'ran') return stop(p.status, p.detail, p.command);
    result.peer = Object.fromEntries(Object.entries(p.result ?? {}).filter(([k]) => k !== 'runs'));
  } finally {
    rmSync(probeDir, { recursive: true, force: true });
  }
  let last: { n: number; ms: number } | undefined;
  let command = '';
  for (const n of c.sizes) {
    const projected = last ? (last.ms * n) / last.n : 0;
    const left = timeLeft(ctx);
    if (projected > left || left <= 0) {
      result.skipped.push({ n, reason: deadlineReason(projected, left) });
      ctx.log(`  parity n=${n}: skipped (${deadlineReason(projected, left)})`);
      continue;
    }
    if (n > b.capabilities.maxSequence) {
      result.skipped.push({ n, reason: `n exceeds maxSequence ${b.capabilities.maxSequence}` });
      continue;
    }
    const t0 = performance.now();
    const dir = mkdtempSync(join(tmpdir(), 'crisp-parity-'));
    try {
      const sample = sampleRows(n, c.rows);
      const ours = new Map<string, Ours>();
      const items: { name: string; file: string }[] = [];
      for (const profile of c.profiles) {
        for (const seed of c.seeds) {
          const name = `${profile}-n${n}-s${seed}`;
          const file = join(dir, `${name}.safetensors`);
          try {
            ours.set(name, await oursOne(ctx, b, profile, n, seed, file, sample));
            items.push({ name, file });
          } catch (e) {
            result.skipped.push({ profile, n, seed, reason: message(e) });
            ctx.log(`  parity ${name}: failed on CRISP's side (${message(e)})`);
          }
        }
      }
      if (!items.length) continue;
      const budgetS = Math.max(30, Math.min(600, Math.floor((timeLeft(ctx) - 30_000) / 1000)));
      const call = callPeer(ctx, peerScript, { ...base, inputs: items, budget_s: budgetS }, dir, budgetS + 120);
      command = call.command;
      if (call.status === 'failed') result.notes.push({ backend: 'cuda', peer, status: 'failed', detail: `n=${n}: ${call.detail}`, command: call.command });
      if (!call.result) {
        for (const it of items) result.skipped.push({ n, profile: ours.get(it.name)?.profile, seed: ours.get(it.name)?.seed, reason: `peer ${call.status}: ${call.detail}` });
        if (call.status === 'absent') return stop('absent', call.detail, call.command);
        continue;
      }
      for (const run of call.result.runs) {
        const o = ours.get(run.name);
        if (!o) continue;
        if (run.error || run.skipped || !run.density) {
          result.skipped.push({ profile: o.profile, n, seed: o.seed, reason: `FlexPrefill: ${run.error ?? run.skipped ?? 'no decisions returned'}` });
          continue;
        }
        const row = compareOne(o, run);
        result.rows.push(row);
        ctx.log(
          `  parity ${run.name}: routes agree ${fmt(row.routeAgreement, 2)}, Jaccard ${fmt(row.meanJaccard, 3)}, density ${row.oursDensity.toFixed(3)} / ${row.theirsDensity.toFixed(3)}, err ${fmt(row.oursRelErr, 4)} / ${fmt(row.theirsRelErr, 4)}, ms ${row.oursMs.median.toFixed(2)} / ${fmt(row.theirsMs?.median, 2)}${(row.others ?? []).map((x) => `; ${x.preset} density ${x.density.toFixed(3)}, err ${fmt(x.relErr, 4)}, ms ${x.ms.median.toFixed(2)}`).join('')}`,
        );
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    last = { n, ms: performance.now() - t0 };
    ctx.progress?.('parity', result);
  }
  result.notes.push({
    backend: 'cuda',
    peer,
    status: result.rows.length ? 'ran' : 'failed',
    detail: result.rows.length ? `${result.rows.length} layers compared` : 'no layer compared (see skipped)',
    ...(command ? { command } : {}),
  });
  return result;
}

const fmt = (x: number | undefined, digits: number): string => (x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(digits));

/** A head counts as differing below this Jaccard of the two block sets (or routed differently). */
export const DIFFERING_JACCARD = 0.99;

/** The heads of one row whose routes differ or whose block sets overlap less than DIFFERING_JACCARD. */
export function differingHeads(r: ParityRow): HeadComparison[] {
  return r.heads.filter(
    (x) => (x.theirsRoute !== undefined && x.theirsRoute !== x.oursRoute) || (x.jaccard !== undefined && x.jaccard < DIFFERING_JACCARD),
  );
}

/** bench.md's parity section. */
export function parityMarkdown(p: ParityResult): string[] {
  const out: string[] = ['', "## Parity: the flexPrefill preset against FlexPrefill's code", ''];
  const { gamma, tau, minBudget, blockSize } = p.params;
  out.push(
    `The same bf16 layer (@crisp/synth, shape ${p.shape.heads},${p.shape.kvHeads},${p.shape.headDim}) through CRISP's flexPrefill preset and FlexPrefill's flex_prefill_attention (γ ${gamma}, τ ${tau}, min_budget ${minBudget} tokens, block ${blockSize}). Routes: share of heads routed the same way (vs / pe = FlexPrefill's query-aware heads). Jaccard: of the causal block sets per head, mean over heads (same route / other route in brackets). Density: selected causal blocks / (Nb (Nb + 1) / 2), mean over heads. Error: relative error against float64 dense attention at ${p.sampledRows} sampled query rows, both outputs scored by the peer. ms: CRISP's sparsePrefill (host clock, plan and attention) and flex_prefill_attention (CUDA events), median.`,
  );
  const info = p.peer as { torch?: string; triton?: string; gpu?: string; flexprefill?: { commit?: string | null; shims?: string[] } } | undefined;
  if (info) {
    const shims = info.flexprefill?.shims?.length ? `; stand-ins: ${info.flexprefill.shims.join('; ')}` : '';
    out.push('', `Peer: torch ${info.torch ?? '?'}, Triton ${info.triton ?? '?'}, ${info.gpu ?? '?'}; FlexPrefill ${info.flexprefill?.commit ?? '(commit not recorded)'}${shims}.`);
  }
  for (const x of p.notes) if (x.status !== 'ran') out.push('', `FlexPrefill peer ${x.status}: ${x.detail}${x.command ? ` (\`${x.command}\`)` : ''}`);
  if (p.rows.length) {
    const f = (x: number | undefined, d: number) => fmt(x, d);
    out.push('');
    out.push('| profile | n | seed | routes agree | PE heads ours / theirs | Jaccard (same / other) | density ours / theirs | error ours / theirs | ms ours / theirs |');
    out.push('|---|---|---|---|---|---|---|---|---|');
    for (const r of p.rows) {
      out.push(
        `| ${r.profile} | ${r.n} | ${r.seed} | ${f(r.routeAgreement, 2)} | ${r.oursPeHeads} / ${r.theirsPeHeads ?? '–'} | ${f(r.meanJaccard, 3)} (${f(r.meanJaccardSameRoute, 3)} / ${f(r.meanJaccardOtherRoute, 3)}) | ${r.oursDensity.toFixed(3)} / ${r.theirsDensity.toFixed(3)} | ${f(r.oursRelErr, 4)} / ${f(r.theirsRelErr, 4)} | ${r.oursMs.median.toFixed(2)} / ${f(r.theirsMs?.median, 2)} |`,
      );
    }
  }
  const differing = p.rows.flatMap((r) => differingHeads(r).map((x) => ({ r, x })));
  if (differing.length) {
    out.push('', '### Heads whose decisions differ', '');
    out.push(
      `Every head routed differently or with a Jaccard below ${DIFFERING_JACCARD} in the table above, with its own relative error (Frobenius over the ${p.sampledRows} sampled rows of that head) from both outputs.`,
      '',
    );
    out.push('| profile | n | seed | head | route ours / theirs | Jaccard | density ours / theirs | head error ours / theirs |');
    out.push('|---|---|---|---|---|---|---|---|');
    for (const { r, x } of differing) {
      out.push(
        `| ${r.profile} | ${r.n} | ${r.seed} | ${x.head} | ${x.oursRoute} / ${x.theirsRoute ?? '–'} | ${fmt(x.jaccard, 3)} | ${x.oursDensity.toFixed(3)} / ${x.theirsDensity.toFixed(3)} | ${fmt(x.oursRelErr, 4)} / ${fmt(x.theirsRelErr, 4)} |`,
      );
    }
  }
  const others = p.rows.filter((r) => r.others?.length);
  if (others.length) {
    out.push('', "### CRISP's presets against FlexPrefill's code on the same layers", '');
    out.push(
      "Each of CRISP's presets run on the same tensors as FlexPrefill's code above (time: sparsePrefill on the host clock, plan and attention; FlexPrefill's: CUDA events around flex_prefill_attention); error scored by the peer at the same rows. Speed-up = FlexPrefill's ms / the preset's ms.",
      '',
    );
    out.push('| profile | n | seed | preset | density | error | ms | FlexPrefill density / error / ms | speed-up |');
    out.push('|---|---|---|---|---|---|---|---|---|');
    for (const r of others) {
      for (const x of r.others!) {
        const speed = r.theirsMs ? r.theirsMs.median / x.ms.median : undefined;
        out.push(
          `| ${r.profile} | ${r.n} | ${r.seed} | ${x.preset} | ${x.density.toFixed(3)} | ${fmt(x.relErr, 4)} | ${x.ms.median.toFixed(2)} | ${r.theirsDensity.toFixed(3)} / ${fmt(r.theirsRelErr, 4)} / ${fmt(r.theirsMs?.median, 2)} | ${speed === undefined ? '–' : `${speed.toFixed(2)}x`} |`,
        );
      }
    }
  }
  for (const s of p.skipped) out.push(`- skipped${s.profile ? ` ${s.profile}` : ''}${s.n ? ` n=${s.n}` : ''}${s.seed !== undefined ? ` seed ${s.seed}` : ''}: ${s.reason}`);
  return out;
}
