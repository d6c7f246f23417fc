/**
 * The roofline lines of the latency suite: each attention kernel's achieved TFLOP/s against
 * the GPU's dense matrix peak. Dense kernels (CRISP's `dense` preset, the SDPA peers) are
 * credited with causal attention's FLOPs over their whole time; a sparse preset's attention
 * call with the FLOPs of the blocks it computes (density × causal), over the attention time
 * alone (its plan excluded), which is the rate its kernel runs at.
 */
import { kn, ms } from './format.js';
import type { BenchResult } from './result.js';
import { causalAttentionFlops } from './stats.js';
import type { LatencyRow } from './suites/latency.js';

/**
 * Dense bf16/f16 matrix peaks reached in practice (TFLOP/s), by a substring of the GPU's
 * name: the H200's ~790 is what its tensor cores sustain on large bf16 matmuls (the figure
 * the attention kernels are measured against). GPUs not listed get no "of peak" column.
 */
export const DENSE_PEAK_TFLOPS: readonly { readonly gpu: string; readonly tflops: number }[] = Object.freeze([{ gpu: 'H200', tflops: 790 }]);

/** The peak for the first GPU of the machine, when known. */
export function densePeak(r: BenchResult): number | undefined {
  const name = r.machine.gpus[0]?.name ?? '';
  return DENSE_PEAK_TFLOPS.find((p) => name.includes(p.gpu))?.tflops;
}

export interface RooflineLine {
  readonly backend: string;
  readonly n: number;
  readonly kernel: string;
  readonly ms: number;
  readonly tflops: number;
  /** share of the peak, when the GPU is listed */
  readonly ofPeak?: number;
}

/** One line per dense kernel, peer and sparse preset's attention, per backend and size. */
export function rooflineLines(r: BenchResult): RooflineLine[] {
  const lat = r.suites.latency;
  if (!lat) return [];
  const peak = densePeak(r);
  const out: RooflineLine[] = [];
  const line = (backend: string, n: number, kernel: string, ms: number, flops: number) => {
    if (!(ms > 0) || !Number.isFinite(ms)) return;
    const tflops = flops / (ms * 1e-3) / 1e12;
    out.push({ backend, n, kernel, ms, tflops, ...(peak ? { ofPeak: tflops / peak } : {}) });
  };
  const byKey = new Map<string, LatencyRow[]>();
  for (const x of lat.rows) {
    const k = `${x.backend}\u0000${x.n}`;
    byKey.set(k, [...(byKey.get(k) ?? []), x]);
  }
  for (const rows of byKey.values()) {
    const { backend, n, shape } = rows[0];
    const full = causalAttentionFlops(n, shape.heads, shape.headDim);
    for (const x of rows) {
      if (x.preset === 'dense') line(backend, n, 'dense (CRISP)', x.ms.median, full);
      else if (x.attentionMs !== undefined && x.density > 0) line(backend, n, `${x.preset} attention (density ${x.density.toFixed(3)})`, x.attentionMs, x.density * full);
    }
    for (const p of lat.peers.rows.filter((y) => y.backend === backend && y.n === n)) line(backend, n, p.peer, p.ms.median, full);
  }
  return out.sort((a, b) => (a.backend === b.backend ? a.n - b.n : a.backend < b.backend ? -1 : 1));
}

/** The roofline section of bench.md (empty when the run timed no attention). */
export function rooflineMarkdown(r: BenchResult): string[] {
  const lines = rooflineLines(r);
  if (lines.length === 0) return [];
  const peak = densePeak(r);
  const out = [
    '',
    '## Roofline: achieved TFLOP/s per kernel',
    '',
    `Causal attention's FLOPs (4·H·d·n(n+1)/2) over the median time: dense kernels over their whole call; a sparse preset's attention call over the blocks it computes (density × causal FLOPs), plan excluded. ${peak ? `Against the GPU's dense bf16 matrix peak of about ${peak} TFLOP/s.` : 'No peak is listed for this GPU.'}`,
    '',
    `| backend | n | kernel | ms | TFLOP/s |${peak ? ' of peak |' : ''}`,
    `|---|---|---|---|---|${peak ? '---|' : ''}`,
  ];
  for (const l of lines) {
    out.push(`| ${l.backend} | ${kn(l.n)} | ${l.kernel} | ${ms(l.ms)} | ${l.tflops.toFixed(1)} |${l.ofPeak !== undefined ? ` ${(100 * l.ofPeak).toFixed(0)}% |` : ''}`);
  }
  return out;
}
