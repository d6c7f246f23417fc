/**
 * The O(n) curve: how many background blocks each VS selector keeps as n doubles.
 *
 * Synthetic score vectors (pure TypeScript, up to 512k tokens): a head with sink mass 0.85
 * in key block 0, 0.03 in the local (last) block, 8 signal blocks of 0.005 each, and the
 * remaining 0.08 spread over the background, either flat (token jitter only) or salient
 * (each background block's mass scaled by a log-normal factor, σ = 0.5, as real text
 * gives). γ = 0.95 cannot be met by anchors plus signal (0.92), so γ coverage fills the
 * rest with background tokens of mass ≈ 0.08/n each: the count it adds grows as O(n).
 * "Background" = selected blocks that are neither anchors nor signal.
 *
 * Real proxy statistics: the llama-like scenario through each backend's proxyStats at the
 * sizes the backend allows; mean blocks kept per (VS head, direction).
 */
import { type DirectionScores, type VsSelector, numBlocks, mulberry32 as rng } from '@crisp/core';
import { cumulativeCoverage, medianFloor, noiseFloor, robustFloor } from '@crisp/select';
import type { OpenBackend } from '../backends.js';
import { deadlineReason, type SuiteContext, message, timeLeft, withTimeout } from '../context.js';
import { latencyInputs } from '../inputs.js';
import { makeScenario } from '../inputs.js';

const B = 128;

export function curveSelectors(): { name: string; selector: VsSelector }[] {
  return [
    { name: 'γ-coverage 0.95', selector: cumulativeCoverage({ gamma: 0.95 }) },
    { name: 'noise floor α=1', selector: noiseFloor({ alpha: 1 }) },
    { name: 'noise floor α=1.25', selector: noiseFloor({ alpha: 1.25 }) },
    { name: 'median floor', selector: medianFloor() },
    { name: 'robust floor c=3', selector: robustFloor({ c: 3 }) },
  ];
}


export interface ScoreHead {
  readonly tokens: Float32Array;
  readonly blocks: Float64Array;
  readonly signal: ReadonlySet<number>;
}

/** The constructed vertical-direction head described in the module comment. */
export function constructedHead(n: number, background: 'flat' | 'salient', seed: number): ScoreHead {
  const Nb = numBlocks(n, B);
  const u = rng(seed);
  const gauss = () => Math.sqrt(-2 * Math.log(1 - u())) * Math.cos(2 * Math.PI * u());
  const signal = new Set<number>();
  for (let s = 0; s < 8; s++) signal.add(1 + Math.floor(((s + 0.5) * (Nb - 2)) / 8));
  const weight = new Float64Array(n);
  const blockW = new Float64Array(Nb);
  for (let J = 1; J < Nb - 1; J++) blockW[J] = signal.has(J) ? 0 : background === 'salient' ? Math.exp(0.5 * gauss()) : 1;
  let bgSum = 0;
  for (let j = 0; j < n; j++) {
    const J = Math.floor(j / B);
    if (J === 0 || J === Nb - 1 || signal.has(J)) continue;
    weight[j] = blockW[J] * (1 + 0.2 * (u() - 0.5));
    bgSum += weight[j];
  }
  const tokens = new Float32Array(n);
  const put = (J: number, mass: number) => {
    const lo = J * B;
    const hi = Math.min(n, lo + B);
    for (let j = lo; j < hi; j++) tokens[j] = mass / (hi - lo);
  };
  put(0, 0.85);
  put(Nb - 1, 0.03);
  for (const J of signal) put(J, 0.005);
  for (let j = 0; j < n; j++) if (weight[j] > 0) tokens[j] = (0.08 * weight[j]) / bgSum;
  const blocks = new Float64Array(Nb);
  for (let j = 0; j < n; j++) blocks[Math.floor(j / B)] += tokens[j];
  return { tokens, blocks, signal };
}

export interface CurveRow {
  readonly n: number;
  readonly background: 'flat' | 'salient';
  readonly selector: string;
  readonly selected: number;
  readonly backgroundBlocks: number;
  readonly signalRecall: number;
  /** the run (its startedAt) that computed this row; set when results are merged */
  readonly run?: string;
}

export interface ProxyCurveRow {
  readonly backend: string;
  readonly n: number;
  readonly selector: string;
  /** mean blocks kept per (VS head, direction) */
  readonly meanBlocks: number;
  readonly numBlocks: number;
  readonly vsHeads: number;
  readonly run?: string;
}

export interface OnCurveResult {
  readonly synthetic: CurveRow[];
  readonly proxy: ProxyCurveRow[];
  readonly skipped: { backend: string; n: number; reason: string }[];
}

export function syntheticCurve(sizes: readonly number[], seed: number): CurveRow[] {
  const rows: CurveRow[] = [];
  for (const n of sizes) {
    for (const background of ['flat', 'salient'] as const) {
      const head = constructedHead(n, background, seed + n);
      const Nb = head.blocks.length;
      const input: DirectionScores = { direction: 'vertical', head: 0, blockScores: head.blocks, tokenScores: head.tokens, blockSize: B, n };
      for (const { name, selector } of curveSelectors()) {
        const kept = selector.select(input);
        let bg = 0;
        let sig = 0;
        for (const J of kept) {
          if (head.signal.has(J)) sig++;
          else if (J !== 0 && J !== Nb - 1) bg++;
        }
        rows.push({ n, background, selector: name, selected: kept.length, backgroundBlocks: bg, signalRecall: sig / head.signal.size });
      }
    }
  }
  return rows;
}

export async function onCurveSuite(ctx: SuiteContext, backends: readonly OpenBackend[]): Promise<OnCurveResult> {
  const c = ctx.config.onCurve;
  const result: OnCurveResult = { synthetic: syntheticCurve(c.syntheticSizes, ctx.config.seed), proxy: [], skipped: [] };
  for (const r of result.synthetic.filter((x) => x.n === c.syntheticSizes[c.syntheticSizes.length - 1])) {
    ctx.log(`  O(n) n=${r.n} ${r.background} ${r.selector}: ${r.backgroundBlocks} background blocks, signal recall ${r.signalRecall}`);
  }
  ctx.progress?.('onCurve', result);
  for (const ob of backends) {
    const b = ob.backend;
    if (!b) continue;
    let last: { n: number; ms: number } | undefined;
    for (const n of c.proxySizes) {
      if (n > b.capabilities.maxSequence) {
        result.skipped.push({ backend: ob.name, n, reason: `n exceeds maxSequence ${b.capabilities.maxSequence}` });
        continue;
      }
      // Input generation and selection are O(n) on the host: project linearly.
      const projected = last ? (last.ms * n) / last.n : 0;
      const left = timeLeft(ctx);
      if (projected > left || left <= 0) {
        result.skipped.push({ backend: ob.name, n, reason: deadlineReason(projected, left) });
        ctx.log(`  O(n) ${ob.name} proxy n=${n}: skipped (${deadlineReason(projected, left)})`);
        continue;
      }
      const t0 = performance.now();
      try {
        const dtype = b.capabilities.dtypes.includes('f32') ? 'f32' : 'bf16';
        const inputs = await latencyInputs(b, 'llama-like', n, c.shape, dtype, ctx.config.seed, Number.POSITIVE_INFINITY);
        try {
          const stats = await withTimeout(
            b.proxyStats(inputs.q, inputs.k, { blockSize: B, wSink: 128, wLocal: 128, tokenScores: true }),
            600_000,
            `${ob.name} proxyStats n=${n}`,
          );
          const Nb = stats.numBlocks;
          const sc = makeScenario('llama-like', n, c.shape, ctx.config.seed);
          const vsHeads = sc.truth.heads.filter((h) => h.expectedRoute === 'vs').map((h) => h.head);
          const heads = inputs.source.includes('synth') && vsHeads.length > 0 ? vsHeads : Array.from({ length: stats.heads }, (_, h) => h);
          for (const { name, selector } of curveSelectors()) {
            let total = 0;
            for (const h of heads) {
              for (const direction of ['vertical', 'slash'] as const) {
                const blocks = (direction === 'vertical' ? stats.verticalBlocks : stats.slashBlocks).subarray(h * Nb, (h + 1) * Nb);
                const tokens = (direction === 'vertical' ? stats.verticalTokens : stats.slashTokens)?.subarray(h * n, (h + 1) * n);
                total += selector.select({ direction, head: h, blockScores: blocks, tokenScores: tokens, blockSize: B, n }).length;
              }
            }
            result.proxy.push({ backend: ob.name, n, selector: name, meanBlocks: total / (2 * heads.length), numBlocks: Nb, vsHeads: heads.length });
          }
          ctx.log(`  O(n) ${ob.name} proxy n=${n}: ${result.proxy.filter((r) => r.backend === ob.name && r.n === n).map((r) => `${r.selector} ${r.meanBlocks.toFixed(1)}`).join(', ')}`);
        } finally {
          inputs.dispose();
        }
      } catch (e) {
        result.skipped.push({ backend: ob.name, n, reason: message(e) });
        ctx.log(`  O(n) ${ob.name} proxy n=${n}: skipped (${message(e)})`);
      }
      last = { n, ms: performance.now() - t0 };
      ctx.progress?.('onCurve', result);
    }
  }
  return result;
}
