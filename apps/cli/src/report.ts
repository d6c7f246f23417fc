/**
 * `crisp report`: one self-contained HTML page (Plotly inlined from plotly.js-dist-min, no
 * network) with the run's numbers and four kinds of plots:
 *   1. per head, block masses p_v sorted on a log axis with the γ cumulative cut and the
 *      α·μ noise floor drawn (the CRISP paper's Figure 1);
 *   2. block-mask heatmaps per policy (a head picker per policy);
 *   3. C_struct against the JSD distance per head, with τ_proxy and τ drawn;
 *   4. density and output error per head and policy.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { CliIo } from './cli-io.js';
import { DENSE_SKIPPED, fmt, pct } from './format.js';
import { checkOutputPath, writeFileAtomic } from './out-file.js';
import { type RunOptions, type RunSummary, runJob } from './run-job.js';

function plotlySource(): string {
  const require = createRequire(import.meta.url);
  const path = require.resolve('plotly.js-dist-min');
  // A literal "</script" inside the bundle would end the inline script early.
  return readFileSync(path, 'utf8').replace(/<\/script/gi, '<\\/script');
}

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** μ = max(1 − p[0] − p[Nb−1], 0) / (Nb − 2): the mean background block mass (CRISP's noise floor). */
export function noiseFloorMu(p: readonly number[]): number {
  const Nb = p.length;
  if (Nb <= 2) return 0;
  return Math.max(1 - p[0] - p[Nb - 1], 0) / (Nb - 2);
}

/** Blocks the γ cumulative-coverage rule keeps on sorted block masses (the shortest prefix reaching γ). */
export function gammaCut(sorted: readonly number[], gamma: number): number {
  let s = 0;
  for (let i = 0; i < sorted.length; i++) {
    s += sorted[i];
    if (s >= gamma) return i + 1;
  }
  return sorted.length;
}

interface Fig {
  readonly id: string;
  readonly data: unknown[];
  readonly layout: Record<string, unknown>;
}

export function buildReportHtml(s: RunSummary, o: { alpha: number; gamma: number; tauProxy: number }): string {
  const figs: Fig[] = [];
  const H = s.input.heads;
  const main = s.policies[0];
  const kindOf = (h: number) => s.truth?.heads[h]?.kind ?? '';
  const headLabel = (h: number) => `head ${h}${kindOf(h) ? ` (${kindOf(h)})` : ''}`;

  // 1. Figure 1: sorted block masses, γ cut and α·μ floor.
  const fig1: string[] = [];
  if (s.proxy) {
    for (let h = 0; h < H; h++) {
      const p = s.proxy.verticalBlocks[h];
      const sorted = [...p].sort((a, b) => b - a);
      const floor = o.alpha * noiseFloorMu(p);
      const cut = gammaCut(sorted, o.gamma);
      const above = p.filter((x) => x > floor).length;
      const id = `fig1-h${h}`;
      fig1.push(id);
      figs.push({
        id,
        data: [
          {
            x: sorted.map((_, i) => i + 1),
            y: sorted.map((v) => Math.max(v, 1e-300)),
            type: 'scatter',
            mode: 'lines+markers',
            name: 'block mass p_v (sorted)',
            marker: { size: 5 },
          },
        ],
        layout: {
          title: { text: `${headLabel(h)}: sink=${p[0].toFixed(2)}, C_struct=${s.proxy.cStruct[h].toFixed(2)}`, font: { size: 13 } },
          xaxis: { title: { text: 'block rank' } },
          yaxis: { type: 'log', title: { text: 'block mass' }, exponentformat: 'power' },
          shapes: [
            { type: 'line', xref: 'paper', x0: 0, x1: 1, y0: floor, y1: floor, line: { color: 'purple', dash: 'dash' } },
            { type: 'line', yref: 'paper', y0: 0, y1: 1, x0: cut + 0.5, x1: cut + 0.5, line: { color: 'crimson', dash: 'dot' } },
          ],
          annotations: [
            { xref: 'paper', x: 1, y: Math.log10(Math.max(floor, 1e-300)), xanchor: 'right', yanchor: 'bottom', text: `α·μ=${floor.toExponential(1)} (${above} blocks above)`, showarrow: false, font: { color: 'purple', size: 11 } },
            { x: cut + 0.5, yref: 'paper', y: 1, xanchor: 'left', text: `γ=${o.gamma} cut: ${cut} blocks`, showarrow: false, font: { color: 'crimson', size: 11 } },
          ],
          showlegend: false,
          margin: { l: 60, r: 10, t: 40, b: 40 },
          height: 300,
        },
      });
    }
  }

  // 2. Block masks per policy, with a head picker.
  const masks: string[] = [];
  const Nb = s.numBlocks;
  for (const [pi, p] of s.policies.entries()) {
    if (!p.rows) continue;
    const zOf = (h: number) => {
      const z: (number | null)[][] = [];
      for (let I = 0; I < Nb; I++) {
        const row: (number | null)[] = new Array(Nb).fill(null);
        for (let J = 0; J <= I; J++) row[J] = 0;
        const r = h * Nb + I;
        for (let t = p.rows!.rowPtr[r]; t < p.rows!.rowPtr[r + 1]; t++) row[p.rows!.cols[t]] = 1;
        z.push(row);
      }
      return z;
    };
    const id = `mask-${pi}`;
    masks.push(id);
    figs.push({
      id,
      data: [{ z: zOf(0), type: 'heatmap', colorscale: [[0, '#eeeeee'], [1, '#1f77b4']], zmin: 0, zmax: 1, showscale: false, hovertemplate: 'query block %{y}, key block %{x}: %{z}<extra></extra>' }],
      layout: {
        title: { text: `${p.policy}: selected blocks (density ${pct(p.density)})`, font: { size: 13 } },
        xaxis: { title: { text: 'key block J' }, constrain: 'domain' },
        yaxis: { title: { text: 'query block I' }, autorange: 'reversed', scaleanchor: 'x' },
        updatemenus: [
          {
            // below the plot, so the picker never hides the title
            x: 0,
            y: -0.16,
            xanchor: 'left',
            yanchor: 'top',
            direction: 'up',
            buttons: Array.from({ length: H }, (_, h) => ({
              label: `head ${h} ${p.heads[h].route.toUpperCase()} ${pct(p.heads[h].density)}`,
              method: 'restyle',
              args: [{ z: [zOf(h)] }],
            })),
          },
        ],
        margin: { l: 60, r: 10, t: 50, b: 110 },
        height: 480,
        width: 440,
      },
    });
  }

  // 3. C_struct vs JSD per head.
  if (s.proxy) {
    const routes = main.heads.map((h) => h.route);
    const trace = (route: string, color: string) => {
      const hs = [...Array(H).keys()].filter((h) => routes[h] === route);
      return {
        x: hs.map((h) => s.proxy!.cStruct[h]),
        y: hs.map((h) => s.proxy!.jsd[h]),
        text: hs.map((h) => `h${h}`),
        mode: 'markers+text',
        textposition: 'top center',
        type: 'scatter',
        name: `${main.policy}: ${route.toUpperCase()}`,
        marker: { size: 10, color },
      };
    };
    figs.push({
      id: 'cstruct-jsd',
      data: [trace('vs', '#1f77b4'), trace('pe', '#d62728'), trace('dense', '#7f7f7f')],
      layout: {
        title: { text: `C_struct vs JSD distance per head (agreement ${pct(main.routingAgreement)})`, font: { size: 13 } },
        xaxis: { title: { text: 'C_struct (anchor mass)' }, range: [0, 1.05] },
        yaxis: { title: { text: 'JSD distance D' } },
        shapes: [
          { type: 'line', yref: 'paper', y0: 0, y1: 1, x0: o.tauProxy, x1: o.tauProxy, line: { dash: 'dash', color: 'purple' } },
          { type: 'line', xref: 'paper', x0: 0, x1: 1, y0: 0.1, y1: 0.1, line: { dash: 'dot', color: 'crimson' } },
        ],
        annotations: [
          { x: o.tauProxy, yref: 'paper', y: 1, text: `τ_proxy=${o.tauProxy}`, showarrow: false, xanchor: 'left' },
          { xref: 'paper', x: 1, y: 0.1, text: 'τ=0.1 (JSD)', showarrow: false, xanchor: 'right', yanchor: 'bottom' },
        ],
        height: 420,
      },
    });
  }

  // 4. Density and output error per head.
  const heads = [...Array(H).keys()].map((h) => `h${h}`);
  figs.push({
    id: 'density',
    data: s.policies.map((p) => ({
      x: heads,
      y: p.heads.map((h) => h.density),
      type: 'bar',
      name: p.policy,
      text: p.heads.map((h) => pct(h.density)),
      textposition: 'outside',
    })),
    layout: { title: { text: 'density per head (selected causal blocks / Nb(Nb+1)/2)', font: { size: 13 } }, barmode: 'group', yaxis: { tickformat: '.0%', range: [0, 1.15] }, height: 380 },
  });
  // (no bars without a dense baseline: every output error is null then)
  if (s.dense) figs.push({
    id: 'error',
    data: s.policies.map((p) => ({
      x: heads,
      y: p.heads.map((h) => (h.outputError === null ? null : Math.max(h.outputError, 1e-12))),
      type: 'bar',
      name: p.policy,
      text: p.heads.map((h) => fmt(h.outputError, 4)),
      textposition: 'outside',
    })),
    layout: { title: { text: 'output error per head ‖O_sparse − O_dense‖ / ‖O_dense‖', font: { size: 13 } }, barmode: 'group', yaxis: { type: 'log', exponentformat: 'power' }, height: 380 },
  });

  const inp = s.input;
  const summaryRows = s.policies
    .map(
      (p) => `<tr><td>${esc(p.policy)}${p.denseReason ? ` (dense: ${esc(p.denseReason)})` : ''}</td><td class="num" data-metric="density">${pct(p.density)}</td><td class="num" data-metric="mass-recall">${pct(p.massRecall)}</td><td class="num" data-metric="output-error">${fmt(p.outputError, 4)}</td><td class="num">${p.needleRecall ? `${pct(p.needleRecall.recall)} (${p.needleRecall.recalled}/${p.needleRecall.total})` : '-'}</td><td class="num">${p.routingAgreement === undefined ? '-' : pct(p.routingAgreement)}</td><td class="num">${fmt(p.timeMs.median, 1)}</td><td class="num">${p.speedup === null ? '-' : `${p.speedup.toFixed(2)}x`}</td></tr>`,
    )
    .join('\n');
  const headRows = main.heads
    .map(
      (h) => `<tr><td>${h.head}</td><td>${esc(h.kind ?? '-')}</td><td>${h.route.toUpperCase()}</td><td class="num">${fmt(h.score)}</td><td class="num">${pct(h.density)}</td><td class="num">${pct(h.massRecall)}</td><td class="num">${fmt(h.outputError, 4)}</td></tr>`,
    )
    .join('\n');
  const div = (id: string, cls = 'plot') => `<div id="${id}" class="${cls}"></div>`;
  const figJson = JSON.stringify(figs).replace(/</g, '\\u003c');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>CRISP report: ${esc(main.policy)} on ${esc(inp.source)}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 14px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 8px; }
.masks { display: flex; flex-wrap: wrap; gap: 16px; }
h2 { margin-top: 28px; } .note { color: #555; font-size: 14px; max-width: 70em; }
</style></head><body>
<h1>CRISP sparse prefill report</h1>
<p id="run-meta">${esc(inp.source)}: n=${inp.n}, H=${inp.heads}, Hkv=${inp.kvHeads}, d=${inp.headDim}, ${inp.dtype}, B=${s.blockSize} (Nb=${Nb}); backend <b>${esc(s.backend)}</b>; ${s.dense ? `dense ${fmt(s.dense.timeMs.median, 1)} ms (median of ${s.dense.timeMs.runs.length})` : esc(DENSE_SKIPPED)}; mass recall over ${s.sampleRows} exact query rows.</p>
<table id="summary"><tr><th>policy</th><th>density</th><th>mass recall</th><th>output error</th><th>needle recall</th><th>C_struct/JSD agreement</th><th>time (ms)</th><th>vs dense</th></tr>
${summaryRows}
</table>
<h2>Per head: ${esc(main.policy)}</h2>
<table id="heads"><tr><th>head</th><th>kind</th><th>route</th><th>${esc(main.scoreName ?? 'score')}</th><th>density</th><th>mass recall</th><th>output error</th></tr>
${headRows}
</table>
<h2>The mass cliff: block masses per head (paper Figure 1)</h2>
<p class="note">Proxy block masses p_v (the last ${s.blockSize} queries), sorted, on a log axis. Purple: CRISP's noise floor α·μ with α=${o.alpha}, μ the mean background block mass; red: where cumulative coverage γ=${o.gamma} stops on these block masses.</p>
<div class="grid">${fig1.map((id) => div(id)).join('')}</div>
<h2>Selected blocks per policy</h2>
<div class="masks">${masks.map((id) => div(id, 'plot mask')).join('')}</div>
<h2>Routing: C_struct against JSD</h2>
${div('cstruct-jsd')}
<h2>Density and output error per head</h2>
${div('density')}${s.dense ? div('error') : ''}
<script>${plotlySource()}</script>
<script>
const FIGS = ${figJson};
window.__crispPlots = Promise.all(FIGS.map((f) => Plotly.newPlot(f.id, f.data, f.layout, { staticPlot: false, displaylogo: false, responsive: false })));
</script>
</body></html>
`;
}

export async function reportCommand(o: RunOptions, out: string, io: CliIo): Promise<void> {
  // Fail before a long run, not after it.
  const path = await checkOutputPath('--out', out);
  const s = await runJob(o, io);
  const main = s.policies[0];
  const alpha = o.overrides.alpha ?? (o.preset === 'crispFast' ? 1.25 : 1.0);
  const html = buildReportHtml(s, { alpha, gamma: o.overrides.gamma ?? 0.95, tauProxy: o.overrides.tauProxy ?? 0.2 });
  await writeFileAtomic('--out', path, html);
  io.stdout.write(
    `wrote ${path} (${(html.length / 1e6).toFixed(1)} MB): ${main.policy} density ${pct(main.density)}, mass recall ${pct(main.massRecall)}, ${main.speedup === null ? `${DENSE_SKIPPED}\n` : `output error ${fmt(main.outputError, 4)}, ${main.speedup.toFixed(2)}x vs dense\n`}`,
  );
}
