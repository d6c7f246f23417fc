/** Human-readable summaries (stdout). JSON output is the same data, serialised. */
import type { CalibrationReport } from '@crisp/synth';
import type { RunSummary } from './run-job.js';

/** What the text output says in place of the dense comparison under --no-dense. */
export const DENSE_SKIPPED = 'dense baseline skipped (--no-dense): no output error or speedup';

export function fmt(x: number | null | undefined, digits = 3): string {
  if (x === null || x === undefined || Number.isNaN(x)) return '-';
  if (x !== 0 && (Math.abs(x) < 10 ** -digits || Math.abs(x) >= 1e6)) return x.toExponential(2);
  return x.toFixed(digits);
}

export function pct(x: number | null | undefined): string {
  return x === undefined || x === null || Number.isNaN(x) ? '-' : `${(100 * x).toFixed(1)}%`;
}

function table(header: string[], rows: string[][]): string {
  const w = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(w[i]) : c.padStart(w[i]))).join('  ');
  return [line(header), line(w.map((x) => '-'.repeat(x))), ...rows.map(line)].join('\n');
}

export function formatRun(s: RunSummary): string {
  const out: string[] = [];
  const i = s.input;
  out.push(
    `crisp run: ${i.source}, n=${i.n}, H=${i.heads}, Hkv=${i.kvHeads}, d=${i.headDim}, ${i.dtype}, B=${s.blockSize} (Nb=${s.numBlocks}), backend ${s.backend}${s.kernels ? ` (attention kernel ${s.kernels.attention}, proxy statistics ${s.kernels.statistics})` : ''}`,
  );
  for (const p of s.policies) {
    out.push('');
    const scoreName = p.scoreName ?? 'score';
    out.push(
      `policy ${p.policy}${p.denseReason ? ` (dense: ${p.denseReason}${p.denseReason === 'length-gate' ? '; pass --no-gate to force the sparse path' : ''})` : ''}`,
    );
    const header = ['head', 'kind', 'route', scoreName, 'density', 'proxy recall', 'mass recall', 'output err'];
    const rows = p.heads.map((h) => [
      String(h.head),
      h.kind ?? '-',
      h.route.toUpperCase(),
      fmt(h.score),
      pct(h.density),
      pct(h.proxyRecall),
      pct(h.massRecall),
      fmt(h.outputError, 4),
    ]);
    out.push(table(header, rows));
    const vs = p.heads.filter((h) => h.route === 'vs').length;
    const pe = p.heads.filter((h) => h.route === 'pe').length;
    out.push(
      `summary ${p.policy}: routes ${vs} VS / ${pe} PE${p.threshold !== undefined ? ` (${scoreName} threshold ${p.threshold})` : ''}; density ${pct(p.density)}; mass recall ${pct(p.massRecall)} (${s.sampleRows} exact rows); ${p.outputError === null ? 'output error not measured (no dense baseline)' : `output error ${fmt(p.outputError, 4)} vs dense`}`,
    );
    const extra: string[] = [];
    if (p.needleRecall && p.needleRecall.total === 0) {
      extra.push('needle recall n/a (the input has no needles)');
    } else if (p.needleRecall) {
      extra.push(
        `needle recall ${pct(p.needleRecall.recall)} (${p.needleRecall.recalled}/${p.needleRecall.total} needle-head pairs; visible to the proxy ${pct(p.needleRecall.visibleRecall)})`,
      );
    }
    if (p.routingAgreement !== undefined) extra.push(`C_struct vs JSD routing agreement ${pct(p.routingAgreement)}`);
    if (p.hostReason) extra.push(`planned on the host: ${p.hostReason}`);
    if (extra.length) out.push(`  ${extra.join('; ')}`);
    const time = `  time ${fmt(p.timeMs.median, 1)} ms (median of ${p.timeMs.runs.length}; plan ${fmt(p.timeMs.planMs, 1)} ms)`;
    out.push(s.dense && p.speedup !== null ? `${time} vs dense ${fmt(s.dense.timeMs.median, 1)} ms: ${p.speedup.toFixed(2)}x` : `${time}; ${DENSE_SKIPPED}`);
  }
  if (s.out) out.push('', `wrote ${s.out.path} (${s.out.bytes} bytes: ${s.out.tensors.join(', ')}) in ${sec(s.out.ms)}`);
  out.push('', phasesLine(s));
  return `${out.join('\n')}\n`;
}

const sec = (ms: number) => `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;

/** Where the wall time went: "phases: backend 0.10 s, generate 2.31 s (16 threads), ...; wall 21.9 s". */
export function phasesLine(s: Pick<RunSummary, 'phasesMs' | 'threads' | 'checkThreads'>): string {
  const p = s.phasesMs;
  const parts = [`backend ${sec(p.backend)}`];
  if (p.generate !== null) parts.push(`generate ${sec(p.generate)} (${s.threads} thread${s.threads === 1 ? '' : 's'})`);
  parts.push(`upload ${sec(p.upload)}`);
  if (p.estimate !== null) parts.push(`estimate ${sec(p.estimate)}`);
  parts.push(p.dense === null ? 'dense skipped' : `dense ${sec(p.dense)}`, `plan+prefill ${sec(p.prefill)}`, `check ${sec(p.check)}${s.checkThreads > 1 ? ` (${s.checkThreads} threads)` : ''}`);
  return `phases: ${parts.join(', ')}; wall ${sec(p.wall)}`;
}

export function formatCalibration(rep: CalibrationReport, title: string): string {
  const header = ['head', 'kind', 'route', 'sink mass', 'C_struct', 'top-1', 'top-1 mass', 'p0', 'p10', 'p50', 'p90', 'p100', 'decades'];
  const rows = rep.perHead.map((c) => [
    String(c.head),
    c.kind ?? '-',
    c.route.toUpperCase(),
    fmt(c.sinkMass),
    fmt(c.cStruct),
    `${c.top1Where}(${c.top1Block})`,
    fmt(c.top1Mass),
    c.percentiles.p0.toExponential(1),
    c.percentiles.p10.toExponential(1),
    c.percentiles.p50.toExponential(1),
    c.percentiles.p90.toExponential(1),
    c.percentiles.p100.toExponential(1),
    c.decades.toFixed(2),
  ]);
  const s = rep.summary;
  const lines = [
    title,
    table(header, rows),
    `VS heads ${s.vsHeads}/${s.heads}: sink mass ${fmt(s.vsSinkMin)}..${fmt(s.vsSinkMax)} (target 0.6..0.95); top-1 block at sink/local for ${pct(s.anchorTop1Share)} of heads (target >= 90%); block masses span ${s.minDecades.toFixed(2)}..${s.medianDecades.toFixed(2)} decades (min..median; target >= 4)`,
    rep.failures.length ? `targets missed:\n  ${rep.failures.join('\n  ')}` : 'all calibration targets met',
  ];
  return `${lines.join('\n')}\n`;
}

/** JSON-safe copy: typed arrays to plain arrays, mask rows dropped (they are for the report). */
export function toJson(x: unknown): string {
  return JSON.stringify(
    x,
    (key, v) => {
      if (key === 'rows' && v && typeof v === 'object' && 'rowPtr' in v) return undefined;
      if (ArrayBuffer.isView(v)) return Array.from(v as unknown as ArrayLike<number>);
      if (v instanceof Map) return Object.fromEntries(v);
      if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
      return v;
    },
    2,
  );
}
