/**
 * `crisp report`: one self-contained HTML page (Plotly inlined from plotly.js-dist-min, no
 * network) with a run's numbers, where it came from, and its plots (report-figs.ts):
 * block masses per head (the CRISP paper's Figure 1), block masks per policy with the ground
 * truth's missed signal blocks, C_struct against JSD, density and error per head, plan and
 * attention time, mass recall against density as α/γ sweep (--sweep), and density and latency
 * against n (several --from files). The page links the run's JSON for download.
 *
 * The run is made here, or read from `crisp run --json` files (--from); a section an older file
 * cannot fill says why instead of failing.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { UsageError, type CliIo } from './cli-io.js';
import { DENSE_SKIPPED, fmt, pct, toJson } from './format.js';
import { checkOutputPath, writeFileAtomic } from './out-file.js';
import { presetSettings } from './provenance.js';
import {
  type Built,
  blockMasks,
  esc,
  type Fig,
  massCliff,
  pageHead,
  perHead,
  routing,
  scaling,
  sweepPlot,
  type Thresholds,
  timeBreakdown,
} from './report-figs.js';
import { readRunJson } from './report-input.js';
import { openLayers } from './layers.js';
import { runModel } from './model-run.js';
import { buildModelReportHtml } from './report-model.js';
import { type RunOptions, type RunSummary, runJob } from './run-job.js';
import { type SweepResult, sweepRefusal, sweepThresholds } from './sweep.js';

export { gammaCut, noiseFloorMu } from './report-figs.js';

export function plotlySource(): string {
  const require = createRequire(import.meta.url);
  const path = require.resolve('plotly.js-dist-min');
  // A literal "</script" inside the bundle would end the inline script early.
  return readFileSync(path, 'utf8').replace(/<\/script/gi, '<\\/script');
}

export interface ReportData {
  /** the runs; the first is the one every per-run section shows */
  readonly runs: readonly RunSummary[];
  readonly sweep?: SweepResult;
  /** why there is no sweep (it was not asked for, or the run cannot be swept) */
  readonly sweepWhy?: string;
}

/** α, γ, τ_proxy the run used: from its provenance, else the preset's defaults. */
export function thresholdsOf(s: RunSummary): Thresholds {
  return s.provenance?.settings ?? presetSettings(s.policies[0].policy.replace(/\(.*$/, ''), {});
}

function provenanceBlock(runs: readonly RunSummary[]): string {
  const rows = runs.map((s) => {
    const p = s.provenance;
    const shape = `n=${s.input.n}`;
    if (!p) return `<tr class="no-provenance"><td>${shape}</td><td colspan="6">not recorded: this run JSON predates provenance (crisp run writes it from this version on)</td></tr>`;
    const commit = p.commit ? `<code class="commit">${esc(p.commit)}</code>${p.dirty ? ' (with uncommitted changes)' : ''}` : 'unknown (no git checkout)';
    const set = Object.entries(p.settings)
      .filter(([k]) => k !== 'preset')
      .map(([k, v]) => `${k}=${v}`)
      .join(', ');
    const m = p.machine;
    return `<tr><td>${shape}</td><td class="date">${esc(p.date)}</td><td>${commit}</td><td>crisp ${esc(p.versions.cli)}, Node ${esc(p.versions.node)}</td><td>${esc(`${m.cpu} (${m.cores} cores), ${m.memoryGiB} GiB, ${m.os} ${m.arch}`)}</td><td>${esc(s.backend)}${s.backendNotes.length ? `<br><small>${s.backendNotes.map(esc).join('<br>')}</small>` : ''}</td><td>${esc(p.settings.preset)}${set ? ` (${esc(set)})` : ''}</td></tr>`;
  });
  return `<table id="provenance-table"><tr><th>run</th><th>date (UTC)</th><th>commit</th><th>versions</th><th>machine</th><th>backend</th><th>policy settings</th></tr>\n${rows.join('\n')}\n</table>`;
}

function downloads(runs: readonly RunSummary[]): string {
  const links = runs.map((s, i) => {
    const json = toJson(s);
    const name = `crisp-run-n${s.input.n}${runs.length > 1 ? `-${i}` : ''}.json`;
    return `<a class="download" id="download-${i}" download="${name}" href="data:application/json;base64,${Buffer.from(json, 'utf8').toString('base64')}">${name}</a> (${(json.length / 1024).toFixed(1)} KiB)`;
  });
  return `<p>The run${runs.length > 1 ? 's' : ''} as <code>crisp run --json</code> writes ${runs.length > 1 ? 'them' : 'it'} (without block masks): ${links.join(', ')}. <code>crisp report --from FILE</code> renders this page again from it.</p>`;
}

function tables(s: RunSummary): string {
  const main = s.policies[0];
  const summaryRows = s.policies
    .map(
      (p) =>
        `<tr><td>${esc(p.policy)}${p.denseReason ? ` (dense: ${esc(p.denseReason)})` : ''}</td><td class="num" data-metric="density">${pct(p.density)}</td><td class="num" data-metric="mass-recall">${pct(p.massRecall)}</td><td class="num" data-metric="output-error">${fmt(p.outputError, 4)}</td><td class="num">${p.needleRecall ? `${pct(p.needleRecall.recall)} (${p.needleRecall.recalled}/${p.needleRecall.total})` : '-'}</td><td class="num">${p.routingAgreement === undefined ? '-' : pct(p.routingAgreement)}</td><td class="num">${fmt(p.timeMs.median, 1)}</td><td class="num">${p.speedup === null ? '-' : `${p.speedup.toFixed(2)}x`}</td></tr>`,
    )
    .join('\n');
  const headRows = main.heads
    .map(
      (h) =>
        `<tr><td>${h.head}</td><td>${esc(h.kind ?? '-')}</td><td>${h.route.toUpperCase()}</td><td class="num">${fmt(h.score)}</td><td class="num">${pct(h.density)}</td><td class="num">${pct(h.massRecall)}</td><td class="num">${fmt(h.outputError, 4)}</td></tr>`,
    )
    .join('\n');
  return `<table id="summary"><tr><th>policy</th><th>density</th><th>mass recall</th><th>output error</th><th>needle recall</th><th>C_struct/JSD agreement</th><th>time (ms)</th><th>vs dense</th></tr>
${summaryRows}
</table>
<h2>Per head: ${esc(main.policy)}</h2>
<table id="heads"><tr><th>head</th><th>kind</th><th>route</th><th>${esc(main.scoreName ?? 'score')}</th><th>density</th><th>mass recall</th><th>output error</th></tr>
${headRows}
</table>`;
}

/** The page sections in order: [id, heading, what fills it]. */
function sections(d: ReportData): [string, string, Built][] {
  const s = d.runs[0];
  const t = thresholdsOf(s);
  return [
    ['mass-cliff', 'The mass cliff: block masses per head (paper Figure 1)', massCliff(s, t)],
    ['masks', 'Selected blocks per policy, with missed signal blocks', blockMasks(s)],
    ['routing', 'Routing: C_struct against JSD', routing(s, t)],
    ['per-head', 'Density and output error per head', perHead(s)],
    ['time', 'Where the time goes: plan and attention', timeBreakdown(s)],
    ['sweep', 'Mass recall against density as α and γ sweep', sweepPlot(d.sweep, d.sweepWhy)],
    ['scaling', 'Density and latency against n', scaling(d.runs)],
  ];
}

export function buildReportHtml(d: ReportData): string {
  const s = d.runs[0];
  const inp = s.input;
  const figs: Fig[] = [];
  const body = sections(d)
    .map(([id, title, b]) => {
      if ('why' in b) return `<section id="${id}" data-shown="no"><h2>${esc(title)}</h2><p class="why">Not shown: ${esc(b.why)}.</p></section>`;
      figs.push(...b.figs);
      return `<section id="${id}" data-shown="yes"><h2>${esc(title)}</h2>${b.note ? `<p class="note">${esc(b.note)}</p>` : ''}${b.html}</section>`;
    })
    .join('\n');
  const figJson = JSON.stringify(figs).replace(/</g, '\\u003c');
  return `${pageHead(
    `CRISP report: ${s.policies[0].policy} on ${inp.source}`,
    `.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 8px; }
.grid.wide { grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); }
.masks { display: flex; flex-wrap: wrap; gap: 16px; }
h2 { margin-top: 28px; } .note { color: #555; font-size: 14px; max-width: 70em; }
.why { color: #8a5a00; background: #fff7e0; border-left: 4px solid #e0a800; padding: 6px 10px; max-width: 70em; }
#provenance-table td { font-size: 13px; vertical-align: top; } code.commit { font-size: 12px; }
`,
  )}
<h1>CRISP sparse prefill report</h1>
<p id="run-meta">${esc(inp.source)}: n=${inp.n}, H=${inp.heads}, Hkv=${inp.kvHeads}, d=${inp.headDim}, ${inp.dtype}, B=${s.blockSize} (Nb=${s.numBlocks}); backend <b>${esc(s.backend)}</b>; ${s.dense ? `dense ${fmt(s.dense.timeMs.median, 1)} ms (median of ${s.dense.timeMs.runs.length})` : esc(DENSE_SKIPPED)}; mass recall over ${s.sampleRows} exact query rows.</p>
<section id="provenance"><h2>Provenance</h2>${provenanceBlock(d.runs)}</section>
<section id="data"><h2>Data</h2>${downloads(d.runs)}</section>
<section id="numbers"><h2>Summary</h2>${tables(s)}</section>
${body}
<script>${plotlySource()}</script>
<script>
const FIGS = ${figJson};
window.__crispPlots = Promise.all(FIGS.map((f) => Plotly.newPlot(f.id, f.data, f.layout, { staticPlot: false, displaylogo: false, responsive: false })));
</script>
</body></html>
`;
}

export interface ReportFlags {
  /** `crisp run --json` files to render instead of running */
  readonly from?: readonly string[];
  readonly sweep?: boolean;
  /** run flags the user typed (refused beside --from: the files already fix the run) */
  readonly runFlags?: readonly string[];
}

export async function reportCommand(o: RunOptions, out: string, io: CliIo, f: ReportFlags = {}): Promise<void> {
  if (f.from?.length && f.runFlags?.length) {
    throw new UsageError(`${f.runFlags.join(', ')} ${f.runFlags.length === 1 ? 'describes' : 'describe'} a run, and --from reads finished runs; drop ${f.runFlags.length === 1 ? 'it' : 'them'} or drop --from`);
  }
  // Fail before a long run, not after it.
  const path = await checkOutputPath('--out', out);
  const set = !f.from?.length && o.qkv !== undefined ? await openLayers(o.qkv, { layout: o.layout, names: o.names, npyUint16: o.npyUint16, dtype: o.dtype }) : undefined;
  if (set) {
    if (f.sweep) {
      await set.close();
      throw new UsageError('--sweep sweeps one layer; with a model dump (--qkv DIR) drop --sweep, or give one layer file');
    }
    const m = await runModel({ ...o, compare: [] }, set, io);
    const html = buildModelReportHtml(m, plotlySource());
    await writeFileAtomic('--out', path, html);
    const t = m.total;
    io.stdout.write(`wrote ${path} (${(html.length / 1e6).toFixed(1)} MB): ${t.layers} layers, density mean ${pct(t.meanDensity)}, worst mass recall ${pct(t.worstRecall.massRecall)}${t.speedup === null ? `; ${DENSE_SKIPPED}` : `, ${t.speedup.toFixed(2)}x vs dense`}\n`);
    return;
  }
  const runs: RunSummary[] = [];
  if (f.from?.length) for (const file of f.from) runs.push(await readRunJson(file));
  else runs.push(await runJob(o, io));
  const s = runs[0];
  let sweep: SweepResult | undefined;
  let sweepWhy: string | undefined;
  if (f.sweep) {
    sweepWhy = sweepRefusal(s) ?? undefined;
    if (!sweepWhy) {
      io.stderr.write('sweeping α and γ on the reference backend...\n');
      sweep = await sweepThresholds(s);
    }
  }
  const html = buildReportHtml({ runs, sweep, sweepWhy });
  await writeFileAtomic('--out', path, html);
  const main = s.policies[0];
  io.stdout.write(
    `wrote ${path} (${(html.length / 1e6).toFixed(1)} MB): ${main.policy} density ${pct(main.density)}, mass recall ${pct(main.massRecall)}, ${main.speedup === null ? DENSE_SKIPPED : `output error ${fmt(main.outputError, 4)}, ${main.speedup.toFixed(2)}x vs dense`}${runs.length > 1 ? ` (and ${runs.length - 1} more run${runs.length > 2 ? 's' : ''})` : ''}${sweep ? `; sweep of ${sweep.points.length} plans` : ''}\n`,
  );
}
