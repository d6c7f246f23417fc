/**
 * `--merge`: fold this run into an existing bench.json, so a machine's results can be built
 * from several commands (one per backend or suite, e.g. under a per-command time limit).
 * Row-based suites are merged by (backend, n, profile): this run's rows replace the old rows
 * with the same key, so a backend's sizes can be split across commands;
 * whole suites this run did not run are kept; the crossover is recomputed from the merged
 * latency. Every command whose rows remain is listed.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { message } from './context.js';
import type { BenchResult } from './result.js';
import { crossoverSuite } from './suites/crossover.js';
import { floorSummary } from './suites/floors.js';

/**
 * A bench.json read back (to merge into, to fold in, or to render), with what results
 * written by older versions lack derived from what they hold: the floors' Pareto flags.
 * Throws when the file is not a crisp-bench/1 result.
 */
export function readResult(file: string): BenchResult {
  const r = JSON.parse(readFileSync(file, 'utf8')) as BenchResult;
  if (r.schema !== 'crisp-bench/1') throw new Error(`${file} is not a crisp-bench/1 result (schema '${String(r.schema)}')`);
  const fl = r.suites.floors;
  if (fl?.summary.some((x) => x.pareto === undefined)) r.suites.floors = { ...fl, summary: floorSummary(fl.summary, fl.rows) };
  return withLiveRuns(r);
}

/**
 * `--fold`: the result files merged in order into `into`, as --merge merges a run (each file's
 * rows replace those with the same key; no `into`: the first file starts it). Throws, naming
 * the file, when one cannot be read as a result; `into` itself is never changed.
 */
export function foldResults(into: BenchResult | undefined, files: readonly string[], log: (line: string) => void): BenchResult | undefined {
  let r = into;
  for (const file of files) {
    let other: BenchResult;
    try {
      other = readResult(resolve(file));
    } catch (e) {
      throw new Error(`--fold ${file}: ${message(e)}`);
    }
    r = r ? mergeResults(r, other, other.backends.filter((b) => b.available).map((b) => b.name)) : other;
    log(`folded ${file} (${other.command})`);
  }
  return r;
}

/**
 * `r` listing only the earlier runs that still contribute: a run every row of which a later
 * command replaced (the same command run again, say) is dropped, so a results folder names the
 * commands behind its numbers, not every command ever merged into it. Rows name their run,
 * and the tfjs, varlen and parity sections (merged whole) name theirs; where one of those was
 * written before it did, every earlier run stays listed.
 */
export function withLiveRuns(r: BenchResult): BenchResult {
  const runs = r.earlierRuns;
  if (!runs?.length) return r;
  // the suites merged whole name their run; one written before they did could be any run's
  const whole = [r.suites.tfjs, r.suites.varlen, r.suites.parity].filter((x) => x !== undefined);
  if (whole.some((x) => x.run === undefined)) return r;
  const used = new Set<string>(whole.map((x) => x.run as string));
  for (const { rows } of rowsOf(r)) for (const row of rows) used.add(row.run ?? r.startedAt);
  const live = runs.filter((e) => used.has(e.startedAt));
  if (live.length === runs.length) return r;
  return { ...r, earlierRuns: live.length ? live : undefined };
}

/** Every row of a suite, for stamping and provenance. */
export function rowsOf(r: BenchResult): { suite: string; rows: readonly { run?: string }[] }[] {
  const s = r.suites;
  return [
    { suite: 'latency', rows: [...(s.latency?.rows ?? []), ...(s.latency?.peers.rows ?? [])] },
    { suite: 'accuracy', rows: [...(s.accuracy?.rows ?? []), ...(s.accuracy?.routing ?? [])] },
    { suite: 'onCurve', rows: [...(s.onCurve?.synthetic ?? []), ...(s.onCurve?.proxy ?? [])] },
    { suite: 'floors', rows: s.floors?.rows ?? [] },
    { suite: 'parallel', rows: s.parallel?.rows ?? [] },
  ];
}

/**
 * Mark every row that has no run yet as this result's (its startedAt), so after merging
 * each row still names the command that measured it. Returns `r` itself.
 */
export function stampRuns(r: BenchResult): BenchResult {
  for (const { rows } of rowsOf(r)) for (const row of rows) (row as { run?: string }).run ??= r.startedAt;
  return r;
}

export function mergeResults(prev: BenchResult, cur: BenchResult, ran: readonly string[]): BenchResult {
  stampRuns(prev);
  stampRuns(cur);
  // A row is replaced when this run produced a row with the same key (backend, and n /
  // profile where rows have them), so one backend's sizes can also be split across commands.
  const key = (r: { backend: string; n?: number; profile?: string; peer?: string; preset?: string }) =>
    `${r.backend}|${r.n ?? ''}|${r.profile ?? ''}`;
  const keep = <T extends { backend: string }>(old: readonly T[] | undefined, now: readonly T[] | undefined, cover?: readonly { backend: string }[]): T[] => {
    const covered = new Set((cover ?? now ?? []).map((r) => key(r)));
    const hasN = (cover ?? now ?? []).some((r) => (r as { n?: number }).n !== undefined);
    return [...(old ?? []).filter((r) => (hasN ? !covered.has(key(r)) : !ran.includes(r.backend))), ...(now ?? [])];
  };
  const p = prev.suites;
  const c = cur.suites;
  const latency =
    c.latency && p.latency
      ? {
          rows: keep(p.latency.rows, c.latency.rows, [...c.latency.rows, ...c.latency.skipped]),
          skipped: keep(p.latency.skipped, c.latency.skipped, [...c.latency.rows, ...c.latency.skipped]),
          peers: {
            rows: keep(p.latency.peers.rows, c.latency.peers.rows),
            notes: [...p.latency.peers.notes.filter((x) => !c.latency!.peers.notes.some((y) => y.backend === x.backend && y.peer === x.peer)), ...c.latency.peers.notes],
          },
        }
      : (c.latency ?? p.latency);
  const accuracy =
    c.accuracy && p.accuracy
      ? { ...c.accuracy, rows: keep(p.accuracy.rows, c.accuracy.rows, [...c.accuracy.rows, ...c.accuracy.skipped]), routing: keep(p.accuracy.routing, c.accuracy.routing, [...c.accuracy.rows, ...c.accuracy.skipped]), skipped: keep(p.accuracy.skipped, c.accuracy.skipped, [...c.accuracy.rows, ...c.accuracy.skipped]) }
      : (c.accuracy ?? p.accuracy);
  const onCurve =
    c.onCurve && p.onCurve
      ? { synthetic: c.onCurve.synthetic, proxy: keep(p.onCurve.proxy, c.onCurve.proxy, [...c.onCurve.proxy, ...c.onCurve.skipped]), skipped: keep(p.onCurve.skipped, c.onCurve.skipped, [...c.onCurve.proxy, ...c.onCurve.skipped]) }
      : (c.onCurve ?? p.onCurve);
  const parallel =
    c.parallel && p.parallel
      ? {
          rows: keep(p.parallel.rows, c.parallel.rows, [...c.parallel.rows, ...c.parallel.skipped]),
          skipped: keep(p.parallel.skipped, c.parallel.skipped, [...c.parallel.rows, ...c.parallel.skipped]),
          notes: [...new Set([...p.parallel.notes, ...c.parallel.notes])],
        }
      : (c.parallel ?? p.parallel);
  const backends = [...prev.backends.filter((b) => !ran.includes(b.name)), ...cur.backends.filter((b) => ran.includes(b.name))];
  const crossover =
    latency && (c.crossover || p.crossover) ? crossoverSuite(latency.rows, new Map(backends.map((b) => [b.name, b.shippedCrossover]))) : undefined;
  return withLiveRuns({
    ...cur,
    backends,
    earlierRuns: [
      ...(prev.earlierRuns ?? []),
      {
        command: prev.command,
        startedAt: prev.startedAt,
        durationS: prev.durationS,
        backends: prev.backends.filter((b) => b.available).map((b) => b.name),
        ...(prev.inProgress ? { inProgress: prev.inProgress } : {}),
      },
    ],
    suites: { latency, accuracy, onCurve, crossover, floors: c.floors ?? p.floors, tfjs: c.tfjs ?? p.tfjs, varlen: c.varlen ?? p.varlen, parity: c.parity ?? p.parity, parallel },
  });
}
