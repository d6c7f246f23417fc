/** The parallel suite's section of bench.md: traffic and load per rank count, then per rank. */
import type { ParallelResult, ParallelRow } from './parallel.js';
import { kn } from '../format.js';

const mib = (bytes: number): string => {
  const x = bytes / 2 ** 20;
  return x >= 100 ? x.toFixed(0) : x >= 1 ? x.toFixed(1) : x.toFixed(3);
};
const pct = (part: number, whole: number): string => (whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : '–');

function table(head: string[], rows: string[][]): string[] {
  return [`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)];
}

/** `reproduce`: the line naming the command(s) that measured the rows. */
export function parallelMarkdown(r: ParallelResult, reproduce: string): string[] {
  const out: string[] = ['', '## Context-parallel prefill: traffic and load per rank', ''];
  out.push(
    "@crisp/parallel shards a layer's sequence over P ranks in a zig-zag layout (rank r holds chunks r and 2P − 1 − r of 2P); every rank makes the single-backend plan from gathered statistics and receives only the K/V blocks (per kv head) its query blocks select. The figures below follow from that plan, made once per size with planPrefill on the backend named (length gate off), on the @crisp/synth llama-like scenario. **K/V received**: bytes every rank receives, in all and on the busiest rank (and that rank over the mean), in the backend's dtype; against a **dense ring** (every shard to every other rank: (P − 1)·n·Hkv·d·2 elements) and a **causal dense** exchange (every block before a rank's last that it does not hold). **Plan bytes**: what a rank receives while planning (proxy rows, log-sum-exps, partial sums, key and, with PE heads, query block means, all float64; the shard and plan checks), from the message sizes; the total is over the ranks. **Work max/mean**: selected (head, query block, key block) triples of each rank's query blocks, the busiest rank over the mean; beside it the same for dense causal attention. MiB = 2^20 bytes. Deterministic for a seed: no spread.",
  );
  out.push('');
  out.push(reproduce);
  for (const backend of [...new Set(r.rows.map((x) => x.backend))]) {
    const rs = r.rows.filter((x) => x.backend === backend);
    const s0 = rs[0];
    out.push('');
    out.push(`**${backend}** (H=${s0.shape.heads}, Hkv=${s0.shape.kvHeads}, d=${s0.shape.headDim}, ${s0.dtype}, B=${s0.blockSize}; inputs: ${[...new Set(rs.map((x) => x.input))].join('; ')})`);
    out.push('');
    out.push(
      ...table(
        ['preset', 'n', 'P', 'density', 'PE heads', 'K/V received MiB', 'of dense ring', 'of causal dense', 'busiest rank MiB', 'K/V max/mean', 'dense ring MiB', 'plan MiB per rank (max)', 'plan MiB total', 'work max/mean', 'dense work max/mean', 'plan s'],
        rs.map((x) => [
          x.preset,
          kn(x.n),
          String(x.ranks),
          x.density.toFixed(3),
          String(x.peHeads),
          mib(x.kvBytes.total),
          pct(x.kvBytes.total, x.denseRingBytes),
          pct(x.kvBytes.total, x.causalDenseBytes),
          mib(x.kvBytes.max),
          (x.kvBytes.max / x.kvBytes.mean).toFixed(3),
          mib(x.denseRingBytes),
          mib(x.planBytes.max),
          mib(x.planBytes.total),
          x.work.imbalance.toFixed(3),
          x.work.denseImbalance.toFixed(3),
          (x.planMs / 1000).toFixed(1),
        ]),
      ),
    );
    out.push('');
    out.push('Per rank (rank 0 first): K/V received MiB; selected triples (thousands).');
    out.push('');
    out.push(...table(['preset', 'n', 'P', 'K/V MiB per rank', 'work per rank (k)'], rs.map(perRankCells)));
  }
  if (r.skipped.length) out.push('');
  for (const s of r.skipped) out.push(`- skipped ${s.backend} n=${kn(s.n)}${s.ranks === undefined ? '' : ` P=${s.ranks}`}: ${s.reason}`);
  if (r.notes.length) out.push('');
  for (const x of r.notes) out.push(`- ${x}`);
  out.push('');
  return out;
}

function perRankCells(x: ParallelRow): string[] {
  return [x.preset, kn(x.n), String(x.ranks), x.kvBytes.perRank.map(mib).join(', '), x.work.perRank.map((w) => (w / 1000).toFixed(1)).join(', ')];
}
