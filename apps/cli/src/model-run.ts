/**
 * `crisp run --qkv DIR` on a whole model dump (layers.ts): every layer in order on one
 * backend, each exactly as a one-layer run (run-job.ts), with a line on stderr as each layer
 * finishes, then one summary line per layer and the model's total. With --out DIR, one
 * output file per layer: DIR/layer_NN.safetensors (out-tensors.ts), each atomic.
 */
import { mkdir, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { CrispError } from '@crisp/core';
import { selectBackend } from './backends.js';
import type { CliIo } from './cli-io.js';
import { DENSE_SKIPPED, fmt, pct } from './format.js';
import type { LayerSet } from './layers.js';
import { checkOutputPath } from './out-file.js';
import type { OutRequest } from './out-tensors.js';
import { type RunOptions, type RunSummary, runJob } from './run-job.js';

export interface LayerLine {
  readonly layer: number;
  readonly n: number;
  /** the preset's overall density */
  readonly density: number;
  readonly massRecall: number;
  /** null under --no-dense */
  readonly outputError: number | null;
  readonly crispMs: number;
  /** null under --no-dense */
  readonly denseMs: number | null;
}

export interface ModelTotal {
  readonly layers: number;
  readonly crispMs: number;
  /** null under --no-dense */
  readonly denseMs: number | null;
  /** dense total / CRISP total; null under --no-dense */
  readonly speedup: number | null;
  readonly meanDensity: number;
  readonly minDensity: number;
  /** the lowest mass recall of any layer, and that layer */
  readonly worstRecall: { readonly layer: number; readonly massRecall: number };
  /** the largest output error of any layer; null under --no-dense */
  readonly worstError: { readonly layer: number; readonly outputError: number } | null;
}

export interface ModelSummary {
  readonly source: string;
  readonly backend: string;
  readonly preset: string;
  readonly lines: readonly LayerLine[];
  readonly total: ModelTotal;
  /** each layer's full run, as `crisp run` reports one layer, with its layer number */
  readonly layers: readonly (RunSummary & { readonly layer: number })[];
  /** --out: the directory that got one file per layer */
  readonly outDir?: string;
}

/** The file --out DIR gets for a layer: layer_07.safetensors (at least two digits). */
export function layerFileName(layer: number, last: number): string {
  return `layer_${String(layer).padStart(Math.max(2, String(last).length), '0')}.safetensors`;
}

/**
 * --out for a model: a directory (made when missing, its parent must exist), and each
 * layer's file in it checked as `crisp run --out FILE` checks its file. Before any work.
 */
export async function checkOutDir(raw: string, set: LayerSet): Promise<string> {
  const dir = resolve(raw);
  const st = await stat(dir).catch((e: NodeJS.ErrnoException) => (e.code === 'ENOENT' ? undefined : Promise.reject(e)));
  if (st && !st.isDirectory()) {
    throw new CrispError('IO_ERROR', `cannot write ${dir} (--out): with a model dump (--qkv ${set.source}) --out names a directory for one file per layer, and ${dir} is not one; give a directory`, { path: dir });
  }
  if (!st) {
    try {
      await mkdir(dir);
    } catch (e) {
      throw new CrispError('IO_ERROR', `cannot create the directory ${dir} (--out): ${(e as Error).message}; create its parent first or pick another --out`, { path: dir });
    }
  }
  const last = set.layers[set.layers.length - 1].layer;
  for (const l of set.layers) await checkOutputPath('--out', join(dir, layerFileName(l.layer, last)));
  return dir;
}

function lineOf(layer: number, s: RunSummary): LayerLine {
  const p = s.policies[0];
  return {
    layer,
    n: s.input.n,
    density: p.density,
    massRecall: p.massRecall,
    outputError: p.outputError,
    crispMs: p.timeMs.median,
    denseMs: s.dense ? s.dense.timeMs.median : null,
  };
}

export function modelTotal(lines: readonly LayerLine[]): ModelTotal {
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const crispMs = sum(lines.map((l) => l.crispMs));
  const dense = lines.every((l) => l.denseMs !== null) ? sum(lines.map((l) => l.denseMs!)) : null;
  const worst = lines.reduce((w, l) => (l.massRecall < w.massRecall ? l : w), lines[0]);
  const errs = lines.filter((l) => l.outputError !== null);
  const worstErr = errs.length === lines.length ? errs.reduce((w, l) => (l.outputError! > w.outputError! ? l : w), errs[0]) : undefined;
  return {
    layers: lines.length,
    crispMs,
    denseMs: dense,
    speedup: dense === null ? null : dense / crispMs,
    meanDensity: sum(lines.map((l) => l.density)) / lines.length,
    minDensity: Math.min(...lines.map((l) => l.density)),
    worstRecall: { layer: worst.layer, massRecall: worst.massRecall },
    worstError: worstErr ? { layer: worstErr.layer, outputError: worstErr.outputError! } : null,
  };
}

/** Runs every layer of `set` (opened and checked) on one backend; closes the set. */
export async function runModel(o: RunOptions, set: LayerSet, io: CliIo, outDir?: string, out?: Omit<OutRequest, 'path'>): Promise<ModelSummary> {
  try {
    const sel = await selectBackend(o.backend);
    for (const note of sel.notes) io.stderr.write(`note: ${note}\n`);
    const layers: (RunSummary & { layer: number })[] = [];
    const last = set.layers[set.layers.length - 1].layer;
    try {
      for (const [i, l] of set.layers.entries()) {
        io.stderr.write(`layer ${l.layer} (${i + 1}/${set.layers.length}): ${l.source}\n`);
        const req = outDir && out ? { ...out, path: join(outDir, layerFileName(l.layer, last)) } : undefined;
        const s = await runJob({ ...o, qkv: undefined, dumpLayer: l, out: req }, io, sel);
        layers.push({ ...s, layer: l.layer });
        const line = lineOf(l.layer, s);
        io.stderr.write(
          `layer ${l.layer} done: density ${pct(line.density)}, mass recall ${pct(line.massRecall)}, crisp ${fmt(line.crispMs, 1)} ms${line.denseMs === null ? '' : ` vs dense ${fmt(line.denseMs, 1)} ms`}${s.out ? `; wrote ${s.out.path}` : ''}\n`,
        );
      }
    } finally {
      sel.backend.dispose();
    }
    const lines = layers.map((s) => lineOf(s.layer, s));
    return { source: set.source, backend: sel.name, preset: o.preset, lines, total: modelTotal(lines), layers, outDir };
  } finally {
    await set.close();
  }
}

function table(header: string[], rows: string[][]): string {
  const w = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r: string[]) => r.map((c, i) => c.padStart(w[i])).join('  ');
  return [line(header), line(w.map((x) => '-'.repeat(x))), ...rows.map(line)].join('\n');
}

export function formatModel(m: ModelSummary): string {
  const first = m.layers[0];
  const i = first.input;
  const rows = m.lines.map((l) => [
    String(l.layer),
    String(l.n),
    pct(l.density),
    pct(l.massRecall),
    fmt(l.outputError, 4),
    fmt(l.crispMs, 1),
    fmt(l.denseMs, 1),
    l.denseMs === null ? '-' : `${(l.denseMs / l.crispMs).toFixed(2)}x`,
  ]);
  const t = m.total;
  const out = [
    `crisp run: ${m.source}, ${t.layers} layers, n=${i.n}, H=${i.heads}, Hkv=${i.kvHeads}, d=${i.headDim}, ${i.dtype}, B=${first.blockSize}, policy ${first.policies[0].policy}, backend ${m.backend}`,
    '',
    table(['layer', 'n', 'density', 'mass recall', 'output err', 'crisp ms', 'dense ms', 'speed-up'], rows),
    '',
    `model: ${t.layers} layers; crisp ${fmt(t.crispMs, 1)} ms${t.denseMs === null ? `; ${DENSE_SKIPPED}` : ` vs dense ${fmt(t.denseMs, 1)} ms: ${t.speedup!.toFixed(2)}x`}; density mean ${pct(t.meanDensity)}, min ${pct(t.minDensity)}; worst mass recall ${pct(t.worstRecall.massRecall)} (layer ${t.worstRecall.layer})${t.worstError ? `; worst output error ${fmt(t.worstError.outputError, 4)} (layer ${t.worstError.layer})` : ''}`,
  ];
  if (m.outDir) {
    const bytes = m.layers.reduce((s, l) => s + (l.out?.bytes ?? 0), 0);
    out.push(`wrote ${m.layers.length} output files to ${m.outDir} (${bytes} bytes)`);
  }
  return `${out.join('\n')}\n`;
}

/** --json for a model: the per-layer lines, the total, and each layer's full run. */
export function modelJson(m: ModelSummary): object {
  return { source: m.source, backend: m.backend, preset: m.preset, outDir: m.outDir, layers: m.layers, lines: m.lines, total: m.total };
}
