/**
 * The report's figures as Plotly figure objects (data + layout; the page calls Plotly.newPlot
 * on each). Every builder returns its figures and the HTML that holds them, or the reason the
 * run it was given cannot show it (an older run JSON, a dump without ground truth, one size).
 */
import { fmt, pct } from './format.js';
import type { PolicyResult, RunSummary } from './run-job.js';
import type { SweepResult } from './sweep.js';
import { missedSignalBlocks } from './truth-blocks.js';

/** The opening of a report page up to <body>: the title, and the CSS every page shares plus `css`. */
export function pageHead(title: string, css: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>${esc(title)}</title>
<link rel="icon" href="data:,">
<style>
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 14px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
${css}
</style></head><body>`;
}

export interface Fig {
  readonly id: string;
  readonly data: unknown[];
  readonly layout: Record<string, unknown>;
}

export type Built = { readonly figs: Fig[]; readonly html: string; readonly note?: string } | { readonly why: string };

export interface Thresholds {
  readonly alpha?: number;
  readonly gamma?: number;
  readonly tauProxy?: number;
}

export function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

const div = (id: string, cls = 'plot') => `<div id="${id}" class="${cls}"></div>`;
const TITLE = { font: { size: 13 } };

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

function headLabel(s: RunSummary, h: number): string {
  const kind = s.truth?.heads[h]?.kind ?? '';
  return `head ${h}${kind ? ` (${kind})` : ''}`;
}

/** 1. Per head, sorted proxy block masses on a log axis with the γ cut and the α·μ floor (paper Figure 1). */
export function massCliff(s: RunSummary, o: Thresholds): Built {
  if (!s.proxy) return { why: 'the run has no proxy statistics (every plan was dense)' };
  const alpha = o.alpha ?? 1;
  const gamma = o.gamma ?? 0.95;
  const figs: Fig[] = [];
  for (let h = 0; h < s.input.heads; h++) {
    const p = s.proxy.verticalBlocks[h];
    const sorted = [...p].sort((a, b) => b - a);
    const floor = alpha * noiseFloorMu(p);
    const cut = gammaCut(sorted, gamma);
    const above = p.filter((x) => x > floor).length;
    figs.push({
      id: `fig1-h${h}`,
      data: [{ x: sorted.map((_, i) => i + 1), y: sorted.map((v) => Math.max(v, 1e-300)), type: 'scatter', mode: 'lines+markers', name: 'block mass p_v (sorted)', marker: { size: 5 } }],
      layout: {
        title: { text: `${headLabel(s, h)}: sink=${p[0].toFixed(2)}, C_struct=${s.proxy.cStruct[h].toFixed(2)}`, ...TITLE },
        xaxis: { title: { text: 'block rank' } },
        yaxis: { type: 'log', title: { text: 'block mass' }, exponentformat: 'power' },
        shapes: [
          { type: 'line', xref: 'paper', x0: 0, x1: 1, y0: floor, y1: floor, line: { color: 'purple', dash: 'dash' } },
          { type: 'line', yref: 'paper', y0: 0, y1: 1, x0: cut + 0.5, x1: cut + 0.5, line: { color: 'crimson', dash: 'dot' } },
        ],
        annotations: [
          { xref: 'paper', x: 1, y: Math.log10(Math.max(floor, 1e-300)), xanchor: 'right', yanchor: 'bottom', text: `α·μ=${floor.toExponential(1)} (${above} blocks above)`, showarrow: false, font: { color: 'purple', size: 11 } },
          { x: cut + 0.5, yref: 'paper', y: 1, xanchor: 'left', text: `γ=${gamma} cut: ${cut} blocks`, showarrow: false, font: { color: 'crimson', size: 11 } },
        ],
        showlegend: false,
        margin: { l: 60, r: 10, t: 40, b: 40 },
        height: 300,
      },
    });
  }
  return {
    figs,
    html: `<div class="grid">${figs.map((f) => div(f.id)).join('')}</div>`,
    note: `Proxy block masses p_v (the last ${s.blockSize} queries), sorted, on a log axis. Purple: CRISP's noise floor α·μ with α=${alpha}, μ the mean background block mass; red: where cumulative coverage γ=${gamma} stops on these block masses.`,
  };
}

/** Selected blocks of head h as a heatmap grid: 1 selected, 0 skipped, null above the diagonal. */
function maskGrid(p: PolicyResult, h: number, Nb: number): (number | null)[][] {
  const z: (number | null)[][] = [];
  for (let I = 0; I < Nb; I++) {
    const row: (number | null)[] = new Array(Nb).fill(null);
    for (let J = 0; J <= I; J++) row[J] = 0;
    const r = h * Nb + I;
    for (let t = p.rows!.rowPtr[r]; t < p.rows!.rowPtr[r + 1]; t++) row[p.rows!.cols[t]] = 1;
    z.push(row);
  }
  return z;
}

/**
 * 2. Block masks per policy with a head picker, a colour key, and (scenarios) the ground
 * truth's signal blocks the plan missed drawn over them. Two traces per head (mask, missed);
 * the picker switches which pair is visible.
 */
export function blockMasks(s: RunSummary): Built {
  const withRows = s.policies.filter((p) => p.rows);
  if (withRows.length === 0) {
    return {
      why: s.policies.some((p) => p.heads.some((h) => h.route !== 'dense'))
        ? 'the run JSON carries no block masks (crisp run --json leaves them out to stay small); run crisp report on the scenario itself to see them'
        : 'every plan was dense, so there are no selected blocks to draw',
    };
  }
  const H = s.input.heads;
  const Nb = s.numBlocks;
  const figs: Fig[] = [];
  const marker = Math.max(3, Math.min(9, Math.round(320 / Nb)));
  for (const [pi, p] of s.policies.entries()) {
    if (!p.rows) continue;
    const data: unknown[] = [];
    const missedCount: number[] = [];
    for (let h = 0; h < H; h++) {
      data.push({
        z: maskGrid(p, h, Nb),
        type: 'heatmap',
        name: `head ${h}`,
        visible: h === 0,
        colorscale: [[0, '#eeeeee'], [0.5, '#eeeeee'], [0.5, '#1f77b4'], [1, '#1f77b4']],
        zmin: 0,
        zmax: 1,
        showscale: true,
        colorbar: { tickvals: [0.25, 0.75], ticktext: ['skipped', 'selected'], thickness: 12, len: 0.4, y: 1, yanchor: 'top', outlinewidth: 0 },
        hovertemplate: 'query block %{y}, key block %{x}: %{z}<extra></extra>',
      });
      if (s.truth) {
        const missed = missedSignalBlocks(p.rows, s.truth, h, s.blockSize, Nb);
        missedCount.push(missed.length);
        data.push({
          x: missed.map(([, J]) => J),
          y: missed.map(([I]) => I),
          type: 'scatter',
          mode: 'markers',
          visible: h === 0,
          name: 'signal block missed (ground truth)',
          showlegend: false,
          marker: { symbol: 'x', size: marker, color: '#d62728' },
          hovertemplate: 'missed signal: query block %{y}, key block %{x}<extra></extra>',
        });
      }
    }
    const per = s.truth ? 2 : 1;
    const id = `mask-${pi}`;
    figs.push({
      id,
      data,
      layout: {
        title: { text: `${p.policy}: selected blocks (density ${pct(p.density)})`, ...TITLE },
        xaxis: { title: { text: 'key block J' }, constrain: 'domain', range: [-0.5, Nb - 0.5], zeroline: false },
        yaxis: { title: { text: 'query block I' }, autorange: 'reversed', scaleanchor: 'x', zeroline: false },
        showlegend: false,
        // the key of the overlay, under the colour key (a legend would drop a head with nothing missed)
        annotations: s.truth
          ? [{ xref: 'paper', yref: 'paper', x: 1.02, y: 0.5, xanchor: 'left', yanchor: 'top', align: 'left', showarrow: false, text: '<span style="color:#d62728">×</span> signal block<br>missed (truth)', font: { size: 11 }, name: 'truth-key' }]
          : [],
        updatemenus: [
          {
            // below the plot, so the picker never hides the title
            x: 0,
            y: -0.16,
            xanchor: 'left',
            yanchor: 'top',
            direction: 'up',
            buttons: Array.from({ length: H }, (_, h) => ({
              label: `head ${h} ${p.heads[h].route.toUpperCase()} ${pct(p.heads[h].density)}${s.truth ? `, ${missedCount[h]} missed` : ''}`,
              method: 'restyle',
              args: [{ visible: data.map((_, t) => Math.floor(t / per) === h) }],
            })),
          },
        ],
        margin: { l: 60, r: 110, t: 50, b: 110 },
        height: 500,
        width: 540,
      },
    });
  }
  return {
    figs,
    html: `<div class="masks">${figs.map((f) => div(f.id, 'plot mask')).join('')}</div>`,
    note: s.truth
      ? `Blue: blocks the plan selected; grey: causal blocks it skipped. Red ×: blocks that hold the scenario's planted signal (sink column, local diagonal, slash lines, vertical stripes${s.truth.stripes ? '' : ' (absent: this run JSON does not list them)'}, needles for their askers) that the plan left out. The picker below each plot switches the head.`
      : 'Blue: blocks the plan selected; grey: causal blocks it skipped. No ground-truth overlay: the run read a Q/K/V dump, which has none.',
  };
}

/** 3. C_struct against the JSD distance per head, with τ_proxy and τ drawn. */
export function routing(s: RunSummary, o: Thresholds): Built {
  if (!s.proxy) return { why: 'the run has no proxy statistics (every plan was dense)' };
  const main = s.policies[0];
  const tauProxy = o.tauProxy ?? 0.2;
  const trace = (route: string, color: string) => {
    const hs = [...Array(s.input.heads).keys()].filter((h) => main.heads[h].route === route);
    return { x: hs.map((h) => s.proxy!.cStruct[h]), y: hs.map((h) => s.proxy!.jsd[h]), text: hs.map((h) => `h${h}`), mode: 'markers+text', textposition: 'top center', type: 'scatter', name: `${main.policy}: ${route.toUpperCase()}`, marker: { size: 10, color } };
  };
  const fig: Fig = {
    id: 'cstruct-jsd',
    data: [trace('vs', '#1f77b4'), trace('pe', '#d62728'), trace('dense', '#7f7f7f')],
    layout: {
      title: { text: `C_struct vs JSD distance per head (agreement ${pct(main.routingAgreement)})`, ...TITLE },
      xaxis: { title: { text: 'C_struct (anchor mass)' }, range: [0, 1.05] },
      yaxis: { title: { text: 'JSD distance D' } },
      shapes: [
        { type: 'line', yref: 'paper', y0: 0, y1: 1, x0: tauProxy, x1: tauProxy, line: { dash: 'dash', color: 'purple' } },
        { type: 'line', xref: 'paper', x0: 0, x1: 1, y0: 0.1, y1: 0.1, line: { dash: 'dot', color: 'crimson' } },
      ],
      annotations: [
        { x: tauProxy, yref: 'paper', y: 1, text: `τ_proxy=${tauProxy}`, showarrow: false, xanchor: 'left' },
        { xref: 'paper', x: 1, y: 0.1, text: 'τ=0.1 (JSD)', showarrow: false, xanchor: 'right', yanchor: 'bottom' },
      ],
      height: 420,
    },
  };
  return { figs: [fig], html: div(fig.id) };
}

/**
 * The head axis of the per-head bar charts. Past 16 bars the value labels overlap, so they
 * move into the hover text; past 8 heads the tick labels tilt; past 24 only every k-th head
 * is labelled (at most 24 labels).
 */
export function headAxis(H: number, policies: number): { labels: boolean; tickangle: number; tickvals: string[] } {
  const every = Math.ceil(H / 24);
  return {
    labels: H * policies <= 16,
    tickangle: H > 8 ? -45 : 0,
    tickvals: Array.from({ length: H }, (_, h) => h).filter((h) => h % every === 0).map((h) => `h${h}`),
  };
}

/** 4. Density and output error per head and policy. */
export function perHead(s: RunSummary): Built {
  const H = s.input.heads;
  const heads = Array.from({ length: H }, (_, h) => `h${h}`);
  const ax = headAxis(H, s.policies.length);
  const bars = (value: (h: PolicyResult['heads'][number]) => number | null, label: (h: PolicyResult['heads'][number]) => string) =>
    s.policies.map((p) => ({
      x: heads,
      y: p.heads.map(value),
      type: 'bar',
      name: p.policy,
      text: p.heads.map(label),
      textposition: ax.labels ? 'outside' : 'none',
      cliponaxis: false,
      hovertemplate: `${esc(p.policy)} %{x}: %{text}<extra></extra>`,
    }));
  const xaxis = { tickmode: 'array', tickvals: ax.tickvals, tickangle: ax.tickangle, automargin: true };
  const hover = ax.labels ? '' : ' (values on hover)';
  const figs: Fig[] = [
    {
      id: 'density',
      data: bars((h) => h.density, (h) => pct(h.density)),
      layout: { title: { text: `density per head (selected causal blocks / Nb(Nb+1)/2)${hover}`, ...TITLE }, barmode: 'group', xaxis, yaxis: { tickformat: '.0%', range: [0, 1.15] }, height: 380 },
    },
  ];
  // (no error bars without a dense baseline: every output error is null then)
  if (s.dense) {
    figs.push({
      id: 'error',
      data: bars((h) => (h.outputError === null ? null : Math.max(h.outputError, 1e-12)), (h) => fmt(h.outputError, 4)),
      layout: { title: { text: `output error per head ‖O_sparse − O_dense‖ / ‖O_dense‖${hover}`, ...TITLE }, barmode: 'group', xaxis, yaxis: { type: 'log', exponentformat: 'power' }, height: 380 },
    });
  }
  return { figs, html: figs.map((f) => div(f.id)).join('') };
}

/** 5. Where the sparse time goes: planning (proxy statistics, routing, selection) and attention, beside dense. */
export function timeBreakdown(s: RunSummary): Built {
  const timed = s.policies.filter((p) => typeof p.timeMs?.planMs === 'number' && Number.isFinite(p.timeMs.planMs));
  if (timed.length === 0) return { why: 'the run JSON has no plan times (timeMs.planMs); it predates them' };
  const dense = s.dense ? [s.dense.timeMs.median] : [];
  const names = [...timed.map((p) => p.policy), ...(s.dense ? ['dense'] : [])];
  const plan = timed.map((p) => Math.min(p.timeMs.planMs, p.timeMs.median));
  const attention = timed.map((p, i) => p.timeMs.median - plan[i]);
  const label = (ms: number) => `${fmt(ms, 1)} ms`;
  const fig: Fig = {
    id: 'time-plot',
    data: [
      { y: names, x: [...plan, ...dense.map(() => 0)], type: 'bar', orientation: 'h', name: 'plan (stats, routing, selection)', marker: { color: '#ff7f0e' }, text: [...plan.map(label), ...dense.map(() => '')], textposition: 'inside' },
      { y: names, x: [...attention, ...dense], type: 'bar', orientation: 'h', name: 'attention', marker: { color: '#1f77b4' }, text: [...attention, ...dense].map(label), textposition: 'inside' },
    ],
    layout: {
      title: { text: `plan and attention time, median of ${s.policies[0].timeMs.runs.length} on ${esc(s.backend)} (plan: the last timed run)${s.dense ? '' : '; dense skipped (--no-dense)'}`, ...TITLE },
      barmode: 'stack',
      xaxis: { title: { text: 'ms' } },
      yaxis: { autorange: 'reversed', automargin: true },
      height: 160 + 40 * names.length,
    },
  };
  return { figs: [fig], html: div(fig.id) };
}

/** 6. Mass recall against density as α and γ sweep (from sweep.ts). */
export function sweepPlot(sw: SweepResult | undefined, why: string | undefined): Built {
  if (!sw) return { why: why ?? 'no sweep was asked for: pass --sweep to crisp report' };
  const trace = (param: 'alpha' | 'gamma', sym: string, color: string) => {
    const pts = sw.points.filter((x) => x.param === param);
    return {
      x: pts.map((x) => x.density),
      y: pts.map((x) => x.massRecall),
      text: pts.map((x) => `${sym}=${x.value}`),
      mode: 'lines+markers+text',
      textposition: 'top left',
      textfont: { size: 10 },
      type: 'scatter',
      name: param === 'alpha' ? `α swept (γ=${sw.gamma})` : `γ swept${sw.alpha === undefined ? '' : ` (α=${sw.alpha})`}`,
      marker: { size: 7, color },
      line: { color },
    };
  };
  const mine = sw.points.filter((x) => (x.param === 'alpha' && x.value === sw.alpha) || (x.param === 'gamma' && sw.alpha === undefined && x.value === sw.gamma));
  const data = [
    ...(sw.points.some((x) => x.param === 'alpha') ? [trace('alpha', 'α', '#1f77b4')] : []),
    trace('gamma', 'γ', '#2ca02c'),
    { x: mine.map((x) => x.density), y: mine.map((x) => x.massRecall), mode: 'markers', type: 'scatter', name: "the run's setting", marker: { size: 15, symbol: 'star', color: '#d62728' } },
  ];
  const fig: Fig = {
    id: 'sweep-plot',
    data,
    layout: {
      title: { text: `${sw.preset}: mass recall against density as the thresholds move`, ...TITLE },
      xaxis: { title: { text: 'density (causal blocks)' }, tickformat: '.0%', range: [0, 1.02] },
      yaxis: { title: { text: 'mass recall' }, tickformat: '.1%', range: [Math.max(0, Math.min(...sw.points.map((x) => x.massRecall)) - 0.01), 1.002] },
      height: 440,
    },
  };
  return {
    figs: [fig],
    html: div(fig.id),
    note: `Reference backend, ${sw.profile} scenario (seed ${sw.seed}) at n=${sw.n}, H=${sw.heads}, Hkv=${sw.kvHeads}, d=${sw.headDim}, B=${sw.blockSize}; mass recall on ${sw.sampleRows} exact float64 rows; ${sw.points.length} plans in ${(sw.ms / 1000).toFixed(1)} s. The sweep's size is capped (n ≤ 2048, H ≤ 8, d ≤ 64): its densities are those of this size, not of the run's.`,
  };
}

/** 7. Density and latency against n, one line per policy, from several runs. */
export function scaling(runs: readonly RunSummary[]): Built {
  const sizes = [...new Set(runs.map((r) => r.input.n))].sort((a, b) => a - b);
  if (sizes.length < 2) return { why: `one size only (n=${sizes.join(', ')}): pass several run JSON files of different --n, e.g. crisp report --from run-4096.json run-8192.json` };
  const sorted = [...runs].sort((a, b) => a.input.n - b.input.n);
  const names = [...new Set(sorted.flatMap((r) => r.policies.map((p) => p.policy)))];
  const series = (value: (p: PolicyResult) => number) =>
    names.map((name) => {
      const at = sorted.flatMap((r) => r.policies.filter((p) => p.policy === name).map((p) => ({ n: r.input.n, y: value(p) })));
      return { x: at.map((a) => a.n), y: at.map((a) => a.y), type: 'scatter', mode: 'lines+markers', name };
    });
  const xaxis = { title: { text: 'n (tokens)' }, type: 'log', tickvals: sizes, ticktext: sizes.map(String) };
  const withDense = sorted.filter((r) => r.dense);
  const dense = { x: withDense.map((r) => r.input.n), y: withDense.map((r) => r.dense!.timeMs.median), type: 'scatter', mode: 'lines+markers', name: 'dense', line: { dash: 'dash', color: '#7f7f7f' } };
  const figs: Fig[] = [
    { id: 'scaling-density', data: series((p) => p.density), layout: { title: { text: 'density against n', ...TITLE }, xaxis, yaxis: { title: { text: 'density' }, tickformat: '.0%', rangemode: 'tozero' }, height: 380 } },
    { id: 'scaling-latency', data: [...series((p) => p.timeMs.median), dense], layout: { title: { text: 'latency against n (median ms)', ...TITLE }, xaxis, yaxis: { title: { text: 'ms' }, type: 'log' }, height: 380 } },
  ];
  const shapes = [...new Set(sorted.map((r) => `H=${r.input.heads}, Hkv=${r.input.kvHeads}, d=${r.input.headDim}, ${r.input.dtype}, ${r.backend}`))];
  return {
    figs,
    html: `<div class="grid wide">${figs.map((f) => div(f.id)).join('')}</div>`,
    note: `${sorted.length} runs at n = ${sizes.join(', ')}; ${shapes.length === 1 ? shapes[0] : `shapes differ between runs: ${shapes.join('; ')}`}.`,
  };
}
