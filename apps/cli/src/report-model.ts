/**
 * `crisp report --qkv DIR` on a whole model dump: one self-contained page with the layers side
 * by side: the model's total, a table of the layers, per-layer figures (density and mass
 * recall; CRISP against dense time), a layer × head grid of density and routes (small
 * multiples of the one-layer report's per-head plot), and each layer's per-head table.
 */
import { DENSE_SKIPPED, fmt, pct, toJson } from './format.js';
import type { ModelSummary } from './model-run.js';
import { esc, type Fig, pageHead } from './report-figs.js';

const TITLE = { x: 0.01, xanchor: 'left', font: { size: 14 } };

function figures(m: ModelSummary): Fig[] {
  const x = m.lines.map((l) => `L${l.layer}`);
  const figs: Fig[] = [
    {
      id: 'layers-density',
      data: [
        { x, y: m.lines.map((l) => l.density), type: 'bar', name: 'density' },
        { x, y: m.lines.map((l) => l.massRecall), type: 'scatter', mode: 'lines+markers', name: 'mass recall' },
      ],
      layout: { title: { text: 'density and mass recall per layer', ...TITLE }, yaxis: { tickformat: '.0%', range: [0, 1.05] }, height: 340 },
    },
    {
      id: 'layers-time',
      data: [
        { x, y: m.lines.map((l) => l.crispMs), type: 'bar', name: m.preset },
        ...(m.total.denseMs === null ? [] : [{ x, y: m.lines.map((l) => l.denseMs), type: 'bar', name: 'dense' }]),
      ],
      layout: { title: { text: 'time per layer (ms, median)', ...TITLE }, barmode: 'group', height: 340 },
    },
  ];
  const heads = m.layers[0].policies[0].heads.map((h) => `h${h.head}`);
  const grid = m.layers.map((s) => s.policies[0].heads.map((h) => h.density));
  const routes = m.layers.map((s) => s.policies[0].heads.map((h) => h.route.toUpperCase()));
  figs.push({
    id: 'layers-heads',
    data: [{ z: grid, x: heads, y: x, text: routes, type: 'heatmap', colorscale: 'Viridis', zmin: 0, zmax: 1, texttemplate: '%{text}', hovertemplate: '%{y} %{x}: %{text}, density %{z:.1%}<extra></extra>', colorbar: { tickformat: '.0%' } }],
    layout: { title: { text: 'density per layer and head (text: the route)', ...TITLE }, height: Math.max(260, 28 * m.layers.length + 120), yaxis: { autorange: 'reversed' } },
  });
  return figs;
}

function layerTable(s: ModelSummary['layers'][number]): string {
  const p = s.policies[0];
  const rows = p.heads
    .map((h) => `<tr><td>${h.head}</td><td>${h.route.toUpperCase()}</td><td class="num">${fmt(h.score)}</td><td class="num">${pct(h.density)}</td><td class="num">${pct(h.massRecall)}</td><td class="num">${fmt(h.outputError, 4)}</td></tr>`)
    .join('\n');
  return `<details class="layer" data-layer="${s.layer}"><summary>layer ${s.layer}: density ${pct(p.density)}, mass recall ${pct(p.massRecall)}, output error ${fmt(p.outputError, 4)}, ${fmt(p.timeMs.median, 1)} ms${p.speedup === null ? '' : ` (${p.speedup.toFixed(2)}x vs dense)`}</summary>
<table><tr><th>head</th><th>route</th><th>${esc(p.scoreName ?? 'score')}</th><th>density</th><th>mass recall</th><th>output error</th></tr>
${rows}
</table></details>`;
}

export function buildModelReportHtml(m: ModelSummary, plotly: string): string {
  const t = m.total;
  const i = m.layers[0].input;
  const rows = m.lines
    .map(
      (l) =>
        `<tr data-layer="${l.layer}"><td>${l.layer}</td><td class="num">${l.n}</td><td class="num">${pct(l.density)}</td><td class="num">${pct(l.massRecall)}</td><td class="num">${fmt(l.outputError, 4)}</td><td class="num">${fmt(l.crispMs, 1)}</td><td class="num">${fmt(l.denseMs, 1)}</td><td class="num">${l.denseMs === null ? '-' : `${(l.denseMs / l.crispMs).toFixed(2)}x`}</td></tr>`,
    )
    .join('\n');
  const figs = figures(m);
  const json = Buffer.from(toJson(m), 'utf8').toString('base64');
  return `${pageHead(
    `CRISP report: ${m.preset} on ${m.source} (${t.layers} layers)`,
    `.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap: 8px; }
details.layer { margin: 4px 0; }`,
  )}
<h1>CRISP sparse prefill report: a whole model</h1>
<p id="run-meta">${esc(m.source)}: ${t.layers} layers, n=${i.n}, H=${i.heads}, Hkv=${i.kvHeads}, d=${i.headDim}, ${i.dtype}, B=${m.layers[0].blockSize}; backend <b>${esc(m.backend)}</b>; policy ${esc(m.preset)}.</p>
<section id="total"><h2>Model</h2><p id="model-total">crisp ${fmt(t.crispMs, 1)} ms${t.denseMs === null ? `; ${esc(DENSE_SKIPPED)}` : ` vs dense ${fmt(t.denseMs, 1)} ms: ${t.speedup!.toFixed(2)}x`}; density mean ${pct(t.meanDensity)}, min ${pct(t.minDensity)}; worst mass recall ${pct(t.worstRecall.massRecall)} (layer ${t.worstRecall.layer})${t.worstError ? `; worst output error ${fmt(t.worstError.outputError, 4)} (layer ${t.worstError.layer})` : ''}.
<a download="crisp-model.json" href="data:application/json;base64,${json}">crisp-model.json</a> (the run as <code>crisp run --qkv DIR --json</code> prints it).</p></section>
<section id="layers"><h2>Layers</h2>
<table id="layers-table"><tr><th>layer</th><th>n</th><th>density</th><th>mass recall</th><th>output error</th><th>crisp ms</th><th>dense ms</th><th>speed-up</th></tr>
${rows}
</table></section>
<section id="figures"><h2>Side by side</h2><div class="grid">${figs.map((f) => `<div id="${f.id}"></div>`).join('')}</div></section>
<section id="per-layer"><h2>Per layer and head</h2>${m.layers.map(layerTable).join('\n')}</section>
<script>${plotly}</script>
<script>
const FIGS = ${JSON.stringify(figs).replace(/</g, '\\u003c')};
window.__crispPlots = Promise.all(FIGS.map((f) => Plotly.newPlot(f.id, f.data, f.layout, { displaylogo: false })));
</script>
</body></html>
`;
}
