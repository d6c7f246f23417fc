/**
 * Model dumps for `--qkv DIR`: every layer's Q/K/V, found and checked from the headers alone
 * before any backend work. Two ways to lay a model out (the same --layout, --names and
 * --npy-uint16 as a one-layer dump):
 *   - a directory of one safetensors file per layer, the layer the last number in the file's
 *     name (`layer_00.safetensors`, `layer_01.safetensors`, ..., as apps/bench/peers/dump_qkv.py
 *     writes them), each file with q, k, v named as a one-layer dump names them;
 *   - one or more safetensors files whose tensor names carry the layer (`model.layers.0.q`,
 *     `model.layers.0.k`, ...; @crisp/io's resolveQkvLayers), a file or a directory of them.
 * A directory of q.npy, k.npy, v.npy (and a safetensors file whose names carry no layer) stays
 * a one-layer dump. Refused with a typed error: no layers, a layer given twice, gaps in the
 * layer numbers (unless every file's `crisp.layers` metadata lists exactly the layers found:
 * a dump of chosen layers), a layer without q, k or v, and layers of different shapes or dtypes.
 */
import { readdir } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { CrispError, type DType, ShapeError } from '@crisp/core';
import { type Layout, type TensorFile, openTensorFile, parseLayout, resolveQkvLayers, resolveQkvNames, splitLayerName } from '@crisp/io';
import { UsageError } from './cli-io.js';
import { type DumpLayer, inFlagWords, openRegular, qkvDims, roleOf, statOrThrow } from './inputs.js';
import type { QkvNameFlags } from './options.js';

export interface LayerSet {
  /** the --qkv path */
  readonly source: string;
  /** ascending by layer */
  readonly layers: readonly DumpLayer[];
  /** every layer's shape and (file) dtype */
  readonly dims: { readonly n: number; readonly H: number; readonly Hkv: number; readonly d: number; readonly dtype: DType };
  close(): Promise<void>;
}

export interface LayerFlags {
  readonly layout?: string;
  readonly names?: QkvNameFlags;
  readonly npyUint16?: 'bf16';
  /** --dtype: converts every layer, so their file dtypes may differ */
  readonly dtype?: DType;
}

const fail = (msg: string, details?: Record<string, unknown>) => new CrispError('FORMAT_ERROR', msg, details);

function hasLayerNames(file: TensorFile): boolean {
  return file.tensors.some((t) => splitLayerName(t.name) !== undefined);
}

/** The layer a file's name says it holds: the last number in its stem ('layer_07' -> 7). */
function layerOfFileName(path: string): number | undefined {
  const m = /(\d+)(?!.*\d)/.exec(basename(path).replace(/\.safetensors$/i, ''));
  return m === null ? undefined : Number(m[1]);
}

function layersOfFile(file: TensorFile, names: QkvNameFlags | undefined, inDir: boolean): DumpLayer[] {
  try {
    if (hasLayerNames(file)) {
      return resolveQkvLayers(
        file.tensors.map((t) => t.name),
        file.path,
        names,
      ).map(({ layer, names: n }) => ({
        layer,
        source: `${file.path} (layer ${layer})`,
        tensors: { q: { file, name: n.q }, k: { file, name: n.k }, v: { file, name: n.v } },
      }));
    }
    const layer = layerOfFileName(file.path);
    if (layer === undefined || !inDir) {
      throw fail(
        `cannot tell which layer ${file.path} holds: name the files of a model dump layer_00.safetensors, layer_01.safetensors, ... or name their tensors model.layers.N.q, model.layers.N.k, model.layers.N.v`,
        { path: file.path },
      );
    }
    const n = resolveQkvNames(
      file.tensors.map((t) => t.name),
      file.path,
      names,
    );
    return [{ layer, source: file.path, tensors: { q: { file, name: n.q }, k: { file, name: n.k }, v: { file, name: n.v } } }];
  } catch (e) {
    throw inFlagWords(e);
  }
}

/** Gaps are refused unless the files list the layers they were dumped for (`crisp.layers`). */
function checkGaps(source: string, found: readonly number[], files: readonly TensorFile[]): void {
  const lo = found[0];
  const hi = found[found.length - 1];
  if (hi - lo + 1 === found.length) return;
  const listed = found.join(',');
  if (files.every((f) => (f.metadata['crisp.layers'] ?? '').replace(/\s+/g, '') === listed)) return;
  const have = new Set(found);
  const missing: number[] = [];
  for (let l = lo; l <= hi && missing.length < 20; l++) if (!have.has(l)) missing.push(l);
  throw fail(
    `${source}: the layers have gaps: ${found.length} layers from ${lo} to ${hi}, missing ${missing.join(', ')}${missing.length === 20 ? ', ...' : ''}; add the missing layers, or, for a dump of chosen layers, list them in each file's __metadata__ as crisp.layers = "${listed}" (dump_qkv.py --layers does)`,
    { path: source, layers: [...found], missing },
  );
}

/**
 * The model dump at `path`, opened and checked, or undefined when `path` is a one-layer dump
 * (a directory of .npy files, or a safetensors file whose tensor names carry no layer).
 */
export async function openLayers(path: string, f: LayerFlags): Promise<LayerSet | undefined> {
  let layout: Layout;
  try {
    layout = parseLayout(f.layout ?? 'nhd');
  } catch {
    throw new UsageError(`--layout must be one of nhd ([n,H,d]), 1nhd ([1,n,H,d]) or hnd ([H,n,d]); got '${f.layout}'`);
  }
  const st = await statOrThrow(path, '--qkv');
  const files: TensorFile[] = [];
  const closeAll = async () => {
    for (const x of files) await x.close().catch(() => undefined);
  };
  const npyOpts = { uint16As: f.npyUint16 };
  try {
    let inDir = false;
    if (st.isDirectory()) {
      inDir = true;
      let entries: string[];
      try {
        entries = await readdir(path);
      } catch (e) {
        throw new CrispError('IO_ERROR', `cannot list ${path} (--qkv): ${(e as Error).message}`, { path });
      }
      const st8 = entries.filter((x) => x.toLowerCase().endsWith('.safetensors') && !x.startsWith('.')).sort();
      if (st8.length === 0) {
        if (entries.some((x) => x.toLowerCase().endsWith('.npy'))) return undefined;
        throw fail(
          `--qkv ${path} is a directory with no layers: no .safetensors files (layer_00.safetensors, ...) and no q/k/v .npy files; give a model dump (apps/bench/peers/dump_qkv.py writes one) or a one-layer dump`,
          { path },
        );
      }
      for (const name of st8) {
        const full = join(path, name);
        files.push(await openRegular(full, 'a layer file of --qkv', () => openTensorFile(full, npyOpts)));
      }
    } else {
      const file = await openRegular(path, '--qkv', () => openTensorFile(path, npyOpts));
      files.push(file);
      if (file.format !== 'safetensors' || !hasLayerNames(file)) {
        await closeAll();
        return undefined;
      }
    }
    const byLayer = new Map<number, DumpLayer>();
    for (const file of files) {
      for (const l of layersOfFile(file, f.names, inDir)) {
        const twice = byLayer.get(l.layer);
        if (twice) throw fail(`${path}: layer ${l.layer} is given twice, in ${twice.source} and in ${l.source}; keep one`, { path, layer: l.layer });
        byLayer.set(l.layer, l);
      }
    }
    const layers = [...byLayer.values()].sort((a, b) => a.layer - b.layer);
    if (layers.length === 0) throw fail(`--qkv ${path} holds no layers`, { path });
    checkGaps(path, layers.map((l) => l.layer), files);
    let dims: LayerSet['dims'] | undefined;
    for (const l of layers) {
      const r = { q: roleOf(l.tensors.q.file, l.tensors.q.name, 'q'), k: roleOf(l.tensors.k.file, l.tensors.k.name, 'k'), v: roleOf(l.tensors.v.file, l.tensors.v.name, 'v') };
      const d = qkvDims({ q: r.q.info.shape, k: r.k.info.shape, v: r.v.info.shape }, layout, l.source);
      const dtypes = [r.q.info.dtype!, r.k.info.dtype!, r.v.info.dtype!];
      if (!f.dtype && (dtypes[1] !== dtypes[0] || dtypes[2] !== dtypes[0])) {
        throw new CrispError('DTYPE_MISMATCH', `${l.source}: q, k, v dtypes differ (${dtypes.join(', ')}); pass --dtype to convert them`);
      }
      const here = { n: d.q.n, H: d.q.H, Hkv: d.k.H, d: d.q.d, dtype: dtypes[0] };
      if (!dims) {
        dims = here;
        continue;
      }
      const text = (x: LayerSet['dims']) => `n=${x.n}, H=${x.H}, Hkv=${x.Hkv}, d=${x.d}`;
      if (here.n !== dims.n || here.H !== dims.H || here.Hkv !== dims.Hkv || here.d !== dims.d) {
        throw new ShapeError(
          `${path}: layer ${l.layer} has ${text(here)} but layer ${layers[0].layer} has ${text(dims)}; every layer of a model dump must have the same shape (dump them from one prompt)`,
          { layer: l.layer },
        );
      }
      if (!f.dtype && here.dtype !== dims.dtype) {
        throw new CrispError('DTYPE_MISMATCH', `${path}: layer ${l.layer} is ${here.dtype} but layer ${layers[0].layer} is ${dims.dtype}; pass --dtype to convert every layer to one`);
      }
    }
    return { source: path, layers, dims: dims!, close: closeAll };
  } catch (e) {
    await closeAll();
    throw e;
  }
}
