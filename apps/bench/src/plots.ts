/** Static SVG plots through Vega-Lite, rendered headless (no canvas, no browser). */
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';

export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  const svg = await view.toSVG();
  view.finalize();
  return svg;
}

type Row = Record<string, string | number | null>;

/** A title with subtitle lines (how the values were measured, the command that reproduces them). */
function titled(title: string, subtitle?: readonly string[]) {
  return subtitle?.length ? { text: title, subtitle: [...subtitle], subtitleFontSize: 9, anchor: 'start' as const } : title;
}

/** Split a long line at spaces so a subtitle stays about as wide as the plot. */
export function wrap(text: string, width = 100): string[] {
  const out: string[] = [];
  let line = '';
  for (const word of text.split(' ')) {
    if (line && line.length + 1 + word.length > width) {
      out.push(line);
      line = `    ${word}`;
    } else line = line ? `${line} ${word}` : word;
  }
  if (line) out.push(line);
  return out;
}

export interface LineOptions {
  title: string;
  subtitle?: readonly string[];
  x: string;
  y: string;
  series: string;
  xTitle: string;
  yTitle: string;
  logX?: boolean;
  logY?: boolean;
  /** optional error band fields */
  yMin?: string;
  yMax?: string;
}

export function lineChart(rows: Row[], o: LineOptions): TopLevelSpec {
  const x = { field: o.x, type: 'quantitative' as const, title: o.xTitle, scale: o.logX ? { type: 'log' as const, base: 2 } : {} };
  const y = { field: o.y, type: 'quantitative' as const, title: o.yTitle, scale: o.logY ? { type: 'log' as const } : {} };
  const base = {
    mark: { type: 'line' as const, point: true },
    encoding: { x, y, color: { field: o.series, type: 'nominal' as const, title: o.series, legend: { labelLimit: 320 } } },
  };
  const spec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
    title: titled(o.title, o.subtitle),
    width: 520,
    height: 320,
    data: { values: rows },
    layer: [
      base,
      ...(o.yMin && o.yMax
        ? [
            {
              mark: { type: 'errorbar' as const },
              encoding: {
                x,
                y: { field: o.yMin, type: 'quantitative' as const, title: o.yTitle },
                y2: { field: o.yMax },
                color: { field: o.series, type: 'nominal' as const },
              },
            },
          ]
        : []),
    ],
  };
  return spec as TopLevelSpec;
}

export interface ScatterOptions {
  title: string;
  subtitle?: readonly string[];
  x: string;
  y: string;
  series: string;
  xTitle: string;
  yTitle: string;
  label?: string;
  logX?: boolean;
}

export function scatterChart(rows: Row[], o: ScatterOptions): TopLevelSpec {
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
    title: titled(o.title, o.subtitle),
    width: 520,
    height: 320,
    data: { values: rows },
    layer: [
      {
        mark: { type: 'point', filled: true, size: 70 },
        encoding: {
          x: { field: o.x, type: 'quantitative', title: o.xTitle, scale: o.logX ? { type: 'log' } : { zero: false } },
          y: { field: o.y, type: 'quantitative', title: o.yTitle, scale: { zero: false } },
          color: { field: o.series, type: 'nominal', title: o.series, legend: { labelLimit: 320 } },
          tooltip: [{ field: o.series }, { field: o.x }, { field: o.y }],
        },
      },
      ...(o.label
        ? [
            {
              mark: { type: 'text' as const, dx: 6, dy: -6, align: 'left' as const, fontSize: 9 },
              encoding: {
                x: { field: o.x, type: 'quantitative' as const },
                y: { field: o.y, type: 'quantitative' as const },
                text: { field: o.label },
              },
            },
          ]
        : []),
    ],
  } as TopLevelSpec;
}
