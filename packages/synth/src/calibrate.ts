/**
 * Calibration: how realistic a scenario's attention looks, read off the proxy statistics
 * (the last B queries' map Â, as the CRISP paper measures heads). Works from any backend's
 * `proxyStats`, so it runs at 512k on a GPU as well as at 4k on the reference.
 *
 * Per head: the sink mass (key block 0 of p_v, the paper's "sink=0.93"), C_struct, where
 * the top-1 mass block lies (sink block 0, local block Nb-1, or elsewhere) and percentiles of
 * the block masses p_v with the decades they span (log10 of max / min positive block).
 */
import { type Backend, DEFAULTS, headSlice, InvalidArgumentError, type ProxyStats } from '@crisp/core';
import type { Scenario } from './scenario.js';
import type { HeadKind } from './profiles.js';
import { uploadScenario } from './upload.js';

export interface HeadCalibration {
  readonly head: number;
  /** ground-truth kind, when the scenario is known */
  readonly kind?: HeadKind;
  /** p_v[0]: mass of key block 0 (the sink block) */
  readonly sinkMass: number;
  /** C_struct: sink-window plus local-window mass */
  readonly cStruct: number;
  /** VS when C_struct >= tauProxy */
  readonly route: 'vs' | 'pe';
  readonly top1Block: number;
  readonly top1Mass: number;
  readonly top1Where: 'sink' | 'local' | 'other';
  /** block-mass percentiles of p_v: min, p10, p50, p90, max */
  readonly percentiles: { readonly p0: number; readonly p10: number; readonly p50: number; readonly p90: number; readonly p100: number };
  /** log10(max / min positive block mass) */
  readonly decades: number;
}

export interface CalibrationSummary {
  readonly heads: number;
  readonly vsHeads: number;
  /** smallest and largest sink mass over VS heads (NaN when there are none) */
  readonly vsSinkMin: number;
  readonly vsSinkMax: number;
  /** share of heads whose top-1 block is the sink or the local window */
  readonly anchorTop1Share: number;
  /** fewest and median decades spanned by a head's block masses */
  readonly minDecades: number;
  readonly medianDecades: number;
}

export interface CalibrationTargets {
  /** VS sink mass range (paper: 0.6 to 0.95) */
  readonly vsSink: readonly [number, number];
  /** least share of heads with the top-1 block at an anchor (paper: 91.3% Llama, 98.3% Qwen) */
  readonly anchorTop1Share: number;
  /** least decades spanned by VS heads' block masses */
  readonly decades: number;
}

export const CALIBRATION_TARGETS: CalibrationTargets = Object.freeze({ vsSink: [0.6, 0.95] as const, anchorTop1Share: 0.9, decades: 4 });

export interface CalibrationReport {
  readonly n: number;
  readonly blockSize: number;
  readonly numBlocks: number;
  readonly perHead: readonly HeadCalibration[];
  readonly summary: CalibrationSummary;
  /** unmet targets, in words; empty when all are met */
  readonly failures: readonly string[];
}

export interface CalibrateOptions {
  /** C_struct threshold that makes a head VS (default 0.2, the paper's τ_proxy) */
  readonly tauProxy?: number;
  /** the scenario the statistics came from: adds ground-truth kinds; VS heads are then the non-diffuse ones */
  readonly scenario?: Pick<Scenario, 'truth'>;
  readonly targets?: CalibrationTargets;
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const x = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(x);
  const hi = Math.ceil(x);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo);
}

/** Calibrate from proxy statistics (pure; no device work). */
export function calibrate(stats: ProxyStats, opts: CalibrateOptions = {}): CalibrationReport {
  const tau = opts.tauProxy ?? 0.2;
  if (!(tau > 0 && tau < 1)) throw new InvalidArgumentError(`tauProxy must be in (0, 1); got ${tau}`);
  const targets = opts.targets ?? CALIBRATION_TARGETS;
  const { heads: H, numBlocks: Nb } = stats;
  const truth = opts.scenario?.truth;
  if (truth && truth.heads.length !== H) {
    throw new InvalidArgumentError(`the scenario has ${truth.heads.length} heads but the statistics ${H}`);
  }
  const perHead: HeadCalibration[] = [];
  for (let h = 0; h < H; h++) {
    const pv = headSlice(stats.verticalBlocks, h, Nb);
    let top = 0;
    for (let J = 1; J < Nb; J++) if (pv[J] > pv[top]) top = J;
    const positive = Float64Array.from(Array.from(pv).filter((x) => x > 0)).sort();
    const cStruct = stats.cStruct[h];
    perHead.push({
      head: h,
      kind: truth?.heads[h].kind,
      sinkMass: pv[0],
      cStruct,
      route: cStruct >= tau ? 'vs' : 'pe',
      top1Block: top,
      top1Mass: pv[top],
      top1Where: top === 0 ? 'sink' : top === Nb - 1 ? 'local' : 'other',
      percentiles: {
        p0: percentile(positive, 0),
        p10: percentile(positive, 10),
        p50: percentile(positive, 50),
        p90: percentile(positive, 90),
        p100: percentile(positive, 100),
      },
      decades: positive.length > 0 ? Math.log10(positive[positive.length - 1] / positive[0]) : 0,
    });
  }
  const isVs = (c: HeadCalibration) => (truth ? truth.heads[c.head].expectedRoute === 'vs' : c.route === 'vs');
  const vs = perHead.filter(isVs);
  const dec = Float64Array.from(perHead.map((c) => c.decades)).sort();
  const summary: CalibrationSummary = {
    heads: H,
    vsHeads: vs.length,
    vsSinkMin: vs.length ? Math.min(...vs.map((c) => c.sinkMass)) : Number.NaN,
    vsSinkMax: vs.length ? Math.max(...vs.map((c) => c.sinkMass)) : Number.NaN,
    anchorTop1Share: perHead.filter((c) => c.top1Where !== 'other').length / H,
    minDecades: dec[0],
    medianDecades: percentile(dec, 50),
  };
  const failures: string[] = [];
  for (const c of vs) {
    if (c.sinkMass < targets.vsSink[0] || c.sinkMass > targets.vsSink[1]) {
      failures.push(`head ${c.head}: VS sink mass ${c.sinkMass.toFixed(3)} outside [${targets.vsSink.join(', ')}]`);
    }
    if (c.decades < targets.decades) {
      failures.push(`head ${c.head}: block masses span ${c.decades.toFixed(2)} decades (< ${targets.decades})`);
    }
  }
  if (summary.anchorTop1Share < targets.anchorTop1Share) {
    failures.push(
      `top-1 block at the sink or local window for ${(100 * summary.anchorTop1Share).toFixed(1)}% of heads (< ${100 * targets.anchorTop1Share}%)`,
    );
  }
  return { n: stats.n, blockSize: stats.blockSize, numBlocks: Nb, perHead, summary, failures };
}

export interface CalibrateScenarioOptions extends CalibrateOptions {
  /** B (default 128) */
  readonly blockSize?: number;
  readonly wSink?: number;
  readonly wLocal?: number;
  /** rows per upload chunk */
  readonly chunkRows?: number;
}

/** Upload a scenario, compute its proxy statistics on the backend, calibrate, free the tensors. */
export async function calibrateScenario(
  backend: Backend,
  sc: Scenario,
  opts: CalibrateScenarioOptions = {},
): Promise<CalibrationReport> {
  const t = await uploadScenario(backend, sc, { chunkRows: opts.chunkRows });
  try {
    const stats = await backend.proxyStats(t.q, t.k, {
      blockSize: opts.blockSize ?? DEFAULTS.blockSize,
      wSink: opts.wSink ?? DEFAULTS.wSink,
      wLocal: opts.wLocal ?? DEFAULTS.wLocal,
      scale: sc.scale,
    });
    return calibrate(stats, { ...opts, scenario: sc });
  } finally {
    t.q.dispose();
    t.k.dispose();
    t.v.dispose();
  }
}
