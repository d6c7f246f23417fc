/** The SVG figures of a run (Vega-Lite, rendered headless). */
import { lineChart, renderSvg, scatterChart, wrap } from './plots.js';
import { suiteCommands, warmupText } from './report.js';
import type { BenchResult } from './result.js';

export interface Figure {
  readonly file: string;
  readonly title: string;
  readonly svg: string;
}

export async function figures(r: BenchResult): Promise<Figure[]> {
  const out: Figure[] = [];
  const add = async (file: string, title: string, spec: Parameters<typeof renderSvg>[0]) => {
    out.push({ file, title, svg: await renderSvg(spec) });
  };
  // Every figure says how its values were measured and the command(s) that reproduce it.
  const how = (suite: string, measured: string): string[] => {
    const cmds = suiteCommands(r, suite);
    return [
      ...wrap(`${measured}${r.inProgress ? ` Partial: the run stopped in suite ${r.inProgress}.` : ''}`),
      ...cmds.flatMap((c, i) => wrap(`${cmds.length > 1 ? `Reproduce (${i + 1}/${cmds.length}, --merge)` : 'Reproduce'}: ${c}`)),
    ];
  };
  const timed = `${r.machine.slug}; median of ${r.config.latency.reps} runs after ${warmupText(r.config.latency)}`;
  const lat = r.suites.latency;
  if (lat && (lat.rows.length > 0 || lat.peers.rows.length > 0)) {
    const rows = [
      ...lat.rows.map((x) => ({ n: x.n, ms: x.ms.median, lo: x.ms.min, hi: x.ms.max, series: `${x.backend} ${x.preset}` })),
      ...lat.peers.rows.map((x) => ({ n: x.n, ms: x.ms.median, lo: x.ms.min, hi: x.ms.max, series: `${x.backend} ${x.peer}` })),
    ];
    await add(
      'latency.svg',
      'Latency against n',
      lineChart(rows, { title: 'One layer, median ms (min-max bars) against n', subtitle: how('latency', `${timed}; bars: min and max.`), x: 'n', y: 'ms', series: 'series', xTitle: 'n (tokens)', yTitle: 'ms', logX: true, logY: true, yMin: 'lo', yMax: 'hi' }),
    );
  }
  const cross = r.suites.crossover;
  if (cross && cross.rows.length > 0) {
    const rows = cross.rows.flatMap((c) => c.ratios.map((q) => ({ n: q.n, ratio: q.ratio, lo: q.lo ?? q.ratio, hi: q.hi ?? q.ratio, series: `${c.backend} ${c.preset}` })));
    await add(
      'crossover.svg',
      'Sparse / dense time',
      lineChart(rows, {
        title: 'Sparse time / dense time (below 1: sparse wins)',
        subtitle: how('latency', `${timed}; ratio of medians; bars: sparse min / dense max to sparse max / dense min.`),
        x: 'n',
        y: 'ratio',
        series: 'series',
        xTitle: 'n (tokens)',
        yTitle: 'sparse / dense',
        logX: true,
        logY: true,
        yMin: 'lo',
        yMax: 'hi',
      }),
    );
  }
  const acc = r.suites.accuracy;
  if (acc && acc.rows.length > 0) {
    const rows = acc.rows.map((x) => ({ density: x.density, massRecall: x.massRecall, series: x.policy, label: `${x.profile} ${x.backend}` }));
    await add(
      'accuracy.svg',
      'Accuracy per preset and profile',
      scatterChart(rows, {
        title: 'Mass recall against density, per preset (labels: profile, backend)',
        subtitle: how('accuracy', `${r.machine.slug}; n ${[...new Set(acc.rows.map((x) => x.n))].join(', ')}; ${acc.sampledRows} sampled rows scored in float64; deterministic for seed ${r.config.seed}, so no spread.`),
        x: 'density', y: 'massRecall', series: 'series', xTitle: 'density (causal blocks)', yTitle: 'mass recall', label: 'label' }),
    );
  }
  const curve = r.suites.onCurve;
  if (curve && curve.synthetic.length > 0) {
    const rows = curve.synthetic.map((x) => ({ n: x.n, blocks: x.backgroundBlocks + 0.5, series: `${x.selector} (${x.background})` }));
    await add(
      'on-curve.svg',
      'Background blocks selected against n',
      lineChart(rows, {
        title: 'Background blocks kept (+0.5 for the log axis) against n',
        subtitle: how('onCurve', `Constructed head (sink 0.85, local 0.03, 8 signal blocks, background 0.08); counts, deterministic for seed ${r.config.seed}, so no spread.`),
        x: 'n', y: 'blocks', series: 'series', xTitle: 'n (tokens)', yTitle: 'background blocks + 0.5', logX: true, logY: true }),
    );
    if (curve.proxy.length > 0) {
      const prow = curve.proxy.map((x) => ({ n: x.n, blocks: x.meanBlocks, series: `${x.backend} ${x.selector}` }));
      await add(
        'on-curve-proxy.svg',
        'Blocks kept on real proxy statistics',
        lineChart(prow, {
          title: 'Mean blocks kept per VS head and direction (llama-like proxy statistics)',
          subtitle: how('onCurve', `${r.machine.slug}; proxy statistics of each backend; deterministic for seed ${r.config.seed}, so no spread.`),
          x: 'n', y: 'blocks', series: 'series', xTitle: 'n (tokens)', yTitle: 'blocks kept', logX: true, logY: true }),
      );
    }
  }
  const fl = r.suites.floors;
  if (fl && fl.summary.length > 0) {
    const rows = fl.summary.map((x) => ({ density: x.density, massRecall: x.massRecall, series: x.family, label: `${x.param}${x.pareto ? ' ◆' : ''}` }));
    await add(
      'floors-pareto.svg',
      'Floors: accuracy against density',
      scatterChart(rows, {
        title: `Mass recall against density, mean over profiles (n=${fl.n})`,
        subtitle: how('floors', `${r.machine.slug}; ${fl.backend ?? ''} statistics; ${[...new Set(fl.rows.map((x) => x.profile))].join(', ')}; ◆ = on the Pareto front; deterministic for seed ${r.config.seed + 1}, so no spread.`),
        x: 'density', y: 'massRecall', series: 'series', xTitle: 'density (causal blocks)', yTitle: 'mass recall', label: 'label' }),
    );
  }
  return out;
}
