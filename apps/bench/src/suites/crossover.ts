/**
 * The crossover length per backend: the smallest measured n from which a sparse preset
 * beats dense at that n and every larger measured n (sparse time includes statistics,
 * routing and selection). Between the last losing and the first winning size the ratio
 * sparse/dense is interpolated in log n to estimate where it crosses 1. The crisp preset's
 * value is the length gate that backend should default to (`Backend.sparseCrossover`).
 */
import type { LatencyRow } from './latency.js';

export interface CrossoverRow {
  readonly backend: string;
  readonly preset: string;
  /** smallest measured n from which sparse wins (null: never within the measured sizes) */
  readonly crossoverN: number | null;
  /** log-n interpolation of where sparse/dense crosses 1 (null when it cannot be bracketed) */
  readonly estimatedN: number | null;
  /** sparse / dense time at each measured n (ratio of medians; lo/hi: the extremes the runs' min and max allow) */
  readonly ratios: { n: number; ratio: number; lo?: number; hi?: number }[];
  readonly note: string;
}

export interface CrossoverResult {
  readonly rows: CrossoverRow[];
  /** per backend, the length gate to ship (crisp preset's crossover; null when unknown) */
  readonly gates: { backend: string; gate: number | null; shipped?: number; note: string }[];
}

export function crossoverSuite(latency: readonly LatencyRow[], shipped: ReadonlyMap<string, number | undefined>): CrossoverResult {
  const rows: CrossoverRow[] = [];
  const backends = [...new Set(latency.map((r) => r.backend))];
  for (const backend of backends) {
    const dense = new Map(latency.filter((r) => r.backend === backend && r.preset === 'dense').map((r) => [r.n, r.ms]));
    const presets = [...new Set(latency.filter((r) => r.backend === backend && r.preset !== 'dense').map((r) => r.preset))];
    for (const preset of presets) {
      const ratios = latency
        .filter((r) => r.backend === backend && r.preset === preset && dense.has(r.n))
        .map((r) => {
          const d = dense.get(r.n)!;
          return { n: r.n, ratio: r.ms.median / d.median, lo: r.ms.min / d.max, hi: r.ms.max / d.min };
        })
        .sort((a, b) => a.n - b.n);
      let first = -1;
      for (let i = ratios.length - 1; i >= 0 && ratios[i].ratio < 1; i--) first = i;
      let crossoverN: number | null = null;
      let estimatedN: number | null = null;
      let note: string;
      if (ratios.length === 0) note = 'no sizes with both dense and sparse timings';
      else if (first < 0) note = `sparse slower than dense at every measured n (up to ${ratios[ratios.length - 1].n})`;
      else if (first === 0) {
        crossoverN = ratios[0].n;
        note = `sparse faster already at the smallest measured n (${ratios[0].n}); the crossover is at or below it`;
      } else {
        crossoverN = ratios[first].n;
        const a = ratios[first - 1];
        const b = ratios[first];
        const t = Math.log(a.ratio) / (Math.log(a.ratio) - Math.log(b.ratio));
        estimatedN = Math.round(2 ** (Math.log2(a.n) + t * (Math.log2(b.n) - Math.log2(a.n))));
        note = `dense wins at ${a.n} (x${a.ratio.toFixed(2)}), sparse wins from ${b.n} (x${b.ratio.toFixed(2)})`;
      }
      rows.push({ backend, preset, crossoverN, estimatedN, ratios, note });
    }
  }
  const gates = backends.map((backend) => {
    const r = rows.find((x) => x.backend === backend && x.preset === 'crisp');
    return {
      backend,
      gate: r ? (r.estimatedN ?? r.crossoverN) : null,
      shipped: shipped.get(backend),
      note: r?.note ?? 'crisp preset not measured',
    };
  });
  return { rows, gates };
}
