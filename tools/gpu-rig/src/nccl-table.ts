/**
 * The scaling table of `h200.sh nccl`: reads OUT/nccl-p<P>-n<N>.log (nccl-main's JSON lines,
 * one per rank) and writes OUT/nccl.json and OUT/nccl.md.
 *
 *   node .device/app/nccl-table.mjs OUT
 *
 * Per rank count and length: the prefill time (each timed prefill's slowest rank, since the
 * ranks start together from a barrier; the median over the prefills), the scaling efficiency
 * against one rank at the same length (T1 / (P · TP)), the first prefill's plan, K/V exchange
 * and attention times (the slowest rank's), the K/V bytes all ranks received against a dense
 * ring's, and rank 0's check against one backend (or `off`, `failed`, and any rank's error).
 */
import { readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface NcclRow {
  readonly ranks: number;
  readonly n: number;
  /** the median over the timed prefills of the slowest rank's wall time, ms (null: none timed) */
  readonly prefillMs: number | null;
  /** T(1 rank, n) / (ranks · T(ranks, n)); null without both times */
  readonly efficiency: number | null;
  readonly planMs: number | null;
  readonly exchangeMs: number | null;
  readonly attentionMs: number | null;
  readonly kvBytesReceived: number | null;
  readonly denseRingBytes: number | null;
  readonly check: 'ok' | 'failed' | 'off';
  /** ranks that reported an error (their messages), or that never reported */
  readonly errors: readonly string[];
}

interface RankLine {
  readonly rank: number;
  readonly prefillMs?: readonly number[];
  readonly timings?: { readonly planMs: number; readonly exchangeMs: number; readonly attentionMs: number };
  readonly traffic?: { readonly kvBytesReceived: number; readonly denseRingBytes: number };
  readonly ok?: boolean;
  readonly error?: string;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** One log's rows: the rank lines (JSON objects with a numeric `rank`), other lines ignored. */
function rankLines(text: string): RankLine[] {
  const out: RankLine[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const o = JSON.parse(line) as RankLine;
      if (typeof o.rank === 'number') out.push(o);
    } catch {
      // (a line cut short when the run was killed)
    }
  }
  return out;
}

/** The table from logs named nccl-p<P>-n<N>.log (name and text), sorted by length then ranks. */
export function ncclTable(logs: readonly { readonly name: string; readonly text: string }[]): NcclRow[] {
  const partial: Omit<NcclRow, 'efficiency'>[] = [];
  for (const { name, text } of logs) {
    const m = /^nccl-p(\d+)-n(\d+)\.log$/.exec(name);
    if (!m) continue;
    const ranks = Number(m[1]);
    const n = Number(m[2]);
    const lines = rankLines(text);
    const byRank = new Map(lines.map((l) => [l.rank, l]));
    const errors: string[] = [];
    for (let r = 0; r < ranks; r++) {
      const l = byRank.get(r);
      if (!l) errors.push(`rank ${r}: no report`);
      else if (l.error !== undefined) errors.push(`rank ${r}: ${l.error}`);
    }
    const good = lines.filter((l) => l.error === undefined);
    const whole = errors.length === 0 && good.length === ranks;
    const reps = whole ? Math.min(...good.map((l) => l.prefillMs?.length ?? 0)) : 0;
    const slowest = Array.from({ length: reps }, (_, i) => Math.max(...good.map((l) => (l.prefillMs as number[])[i])));
    // a field of every rank, or null when a rank lacks it (or the run is partial)
    const everyRank = (f: (l: RankLine) => number | undefined): number[] | null => {
      const xs = good.map(f).filter((x): x is number => typeof x === 'number');
      return whole && xs.length === ranks ? xs : null;
    };
    const maxOf = (f: (l: RankLine) => number | undefined) => everyRank(f)?.reduce((a, b) => Math.max(a, b)) ?? null;
    const sumOf = (f: (l: RankLine) => number | undefined) => everyRank(f)?.reduce((a, b) => a + b) ?? null;
    const r0 = byRank.get(0);
    partial.push({
      ranks,
      n,
      prefillMs: slowest.length ? median(slowest) : null,
      planMs: maxOf((l) => l.timings?.planMs),
      exchangeMs: maxOf((l) => l.timings?.exchangeMs),
      attentionMs: maxOf((l) => l.timings?.attentionMs),
      kvBytesReceived: sumOf((l) => l.traffic?.kvBytesReceived),
      denseRingBytes: whole && r0?.traffic ? r0.traffic.denseRingBytes : null,
      check: r0?.ok === undefined ? (whole ? 'off' : 'failed') : r0.ok ? 'ok' : 'failed',
      errors,
    });
  }
  partial.sort((a, b) => a.n - b.n || a.ranks - b.ranks);
  return partial.map((row) => {
    const one = partial.find((x) => x.n === row.n && x.ranks === 1)?.prefillMs ?? null;
    const efficiency = one !== null && row.prefillMs !== null ? one / (row.ranks * row.prefillMs) : null;
    return { ...row, efficiency };
  });
}

const f = (x: number | null, digits: number) => (x === null ? '–' : x.toFixed(digits));
const mib = (x: number | null) => (x === null ? '–' : (x / 2 ** 20).toFixed(1));

/** The table as markdown (one row per rank count and length). */
export function ncclMarkdown(rows: readonly NcclRow[]): string {
  const out = [
    '| n | ranks | prefill ms | efficiency | plan ms | K/V exchange ms | attention ms | K/V received MiB (all ranks) | dense ring MiB | check |',
    '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |',
  ];
  for (const r of rows) {
    const check = r.errors.length ? `failed: ${r.errors.join('; ').replaceAll('|', '/')}` : r.check;
    out.push(
      `| ${r.n} | ${r.ranks} | ${f(r.prefillMs, 1)} | ${f(r.efficiency, 2)} | ${f(r.planMs, 1)} | ${f(r.exchangeMs, 1)} | ${f(r.attentionMs, 1)} | ${mib(r.kvBytesReceived)} | ${mib(r.denseRingBytes)} | ${check} |`,
    );
  }
  return `${out.join('\n')}\n`;
}

function main(dir: string): void {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (e) {
    process.stderr.write(`nccl-table: cannot read ${dir}: ${(e as Error).message}\n`);
    process.exitCode = 2;
    return;
  }
  const logs = names
    .filter((name) => /^nccl-p\d+-n\d+\.log$/.test(name))
    .map((name) => ({ name, text: readFileSync(join(dir, name), 'utf8') }));
  const rows = ncclTable(logs);
  // whole files or none: each is written beside and renamed into place
  for (const [file, body] of [
    ['nccl.json', `${JSON.stringify(rows, null, 1)}\n`],
    ['nccl.md', ncclMarkdown(rows)],
  ] as const) {
    writeFileSync(join(dir, `${file}.tmp`), body);
    renameSync(join(dir, `${file}.tmp`), join(dir, file));
  }
  process.stdout.write(ncclMarkdown(rows));
}

if (process.argv[1] && /nccl-table\.(m?js|ts)$/.test(process.argv[1])) {
  const dir = process.argv[2];
  if (!dir) {
    process.stderr.write('usage: node nccl-table.mjs OUT (the folder holding nccl-p<P>-n<N>.log)\n');
    process.exitCode = 2;
  } else {
    main(dir);
  }
}
