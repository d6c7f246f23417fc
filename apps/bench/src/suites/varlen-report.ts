/** The varlen suite's section of bench.md: the ragged batch per backend, then chunked prefill. */
import type { Spread } from '../stats.js';
import type { VarlenResult } from './varlen.js';
import { kn, ms } from '../format.js';

const cell = (s: Spread | undefined): string => (s ? `${ms(s.median)} [${ms(s.min)}, ${ms(s.max)}]` : '–');
const ratio = (a: number | undefined, b: number | undefined): string => (a !== undefined && b !== undefined && b > 0 ? `${(a / b).toFixed(2)}x` : '–');
const e = (x: number | undefined): string => (x === undefined || !Number.isFinite(x) ? '–' : x === 0 ? '0' : x.toExponential(2));

function table(head: string[], rows: string[][]): string[] {
  return [`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)];
}

export function varlenMarkdown(r: VarlenResult, reps: number, warmup: number): string[] {
  const out: string[] = ['', '## Varlen batches and chunked prefill', ''];
  out.push(
    `A ragged batch: sequences with lengths drawn uniformly from a range (fixed seed), each the @crisp/synth llama-like scenario with its own seed, packed as FlashAttention's cu_seqlens layout. Timed in the same run, wall ms from the call to the output on the device, median of ${reps} runs after ${warmup} warm-up [min, max]: **varlen** = varlenPrefill of the whole batch (every sequence planned on its own, one varlenAttention launch); **singles** = one sparsePrefill per sequence on sliceRows views of the same packed tensors (the same bytes), all of them; **dense** = CRISP's dense kernel per sequence, all of them; SDPA peers = PyTorch scaled_dot_product_attention per sequence (the latency suite's peer, on its own hash inputs of the same lengths), the sum of its medians. Plan share = varlen's planMs (from the call until the batch's attention is queued) / its totalMs. The check compares varlen's output with the singles' (same plans, same kernels).`,
  );
  out.push('');
  out.push(`Reproduce: \`${r.command}\` (from the repository root).`);
  for (const b of r.batches) {
    const peers = b.peers.map((p) => p.peer);
    out.push('');
    out.push(`**${b.backend}** (H=${b.shape.heads}, Hkv=${b.shape.kvHeads}, d=${b.shape.headDim}, ${b.dtype}; ${b.policy}; ${b.lengths.length} sequences, lengths seed ${b.lengthSeed}, ${b.lengths.reduce((a, x) => a + x, 0)} tokens; inputs: ${b.input || '–'}${b.jitWarmup ? `; timed after ${b.jitWarmup.prefills} untimed prefills of the ${kn(b.jitWarmup.n)} sequence (JIT warm-up)` : ''})`);
    out.push('');
    out.push(
      ...table(
        ['varlen', 'singles', 'dense', ...peers, 'varlen vs singles', 'varlen vs dense', ...peers.map((p) => `varlen vs ${p}`), 'varlen plan ms', 'plan share', 'singles plan ms', 'overall density', 'max abs diff vs singles'],
        [
          [
            cell(b.varlen?.ms),
            cell(b.singles?.ms),
            cell(b.dense?.ms),
            ...b.peers.map((p) => ms(p.ms)),
            ratio(b.singles?.ms.median, b.varlen?.ms.median),
            ratio(b.dense?.ms.median, b.varlen?.ms.median),
            ...b.peers.map((p) => ratio(p.ms, b.varlen?.ms.median)),
            b.varlen ? ms(b.varlen.planMs) : '–',
            b.varlen ? `${(100 * b.varlen.planShare).toFixed(1)}%` : '–',
            b.singles ? ms(b.singles.planMs) : '–',
            b.overallDensity === undefined ? '–' : b.overallDensity.toFixed(3),
            b.check ? `${e(b.check.maxAbsDiff)} (${b.check.allRows ? 'every' : 'sampled'} row${b.check.deviceRelErr === undefined ? '' : `; ‖Δ‖/‖singles‖ over every element ${e(b.check.deviceRelErr)}`}; ${b.check.rows} rows)` : '–',
          ],
        ],
      ),
    );
    if (b.sequences.length) {
      out.push('');
      out.push(
        ...table(
          ['sequence', 'n', 'seed', 'density', 'dense because', 'vs dense (sampled rows)', ...peers.map((p) => `${p} ms`)],
          b.sequences.map((s, i) => [String(i), kn(s.n), String(s.seed), s.density.toFixed(3), s.denseReason ?? '', e(s.relErrVsDense), ...b.peers.map((p) => (p.perSequence[i] === null ? '–' : ms(p.perSequence[i]!)))]),
        ),
      );
    }
  }
  for (const c of r.chunked) {
    out.push('');
    out.push(
      `**${c.backend}, chunked prefill** (n=${kn(c.n)} in ${c.chunks} chunks, ${c.policy}, ${c.dtype}, seed ${c.seed}): chunk c's queries against the keys of rows [0, (c+1)·n/${c.chunks}), with LSE, its time summed over the chunks, against one sparsePrefill of the whole sequence; errors ‖o − dense‖/‖dense‖ against CRISP's dense output on ${c.relErrVsDense?.rows ?? '–'} sampled rows.`,
    );
    out.push('');
    out.push(
      ...table(
        ['', 'ms', 'plan ms', 'density', 'vs dense'],
        [
          [`${c.chunks} chunks`, cell(c.chunked?.ms), c.chunked ? ms(c.chunked.planMs) : '–', c.chunked ? c.chunked.perChunk.map((x) => x.density.toFixed(3)).join(', ') : c.refused ? `refused at chunk ${c.refused.chunk} (${c.refused.code})` : '–', e(c.relErrVsDense?.chunked)],
          ['full', cell(c.full?.ms), c.full ? ms(c.full.planMs) : '–', c.full ? c.full.density.toFixed(3) : '–', e(c.relErrVsDense?.full)],
        ],
      ),
    );
    if (c.chunked) {
      out.push('');
      out.push(...table(['chunk', 'queries', 'keys', 'density', 'ms', 'plan ms'], c.chunked.perChunk.map((x, i) => [String(i), kn(x.queries), kn(x.keys), x.density.toFixed(3), ms(x.ms), ms(x.planMs)])));
    }
  }
  if (r.notes.length) out.push('');
  for (const x of r.notes) out.push(`- ${x}`);
  return out;
}
