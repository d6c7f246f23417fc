// crisp run --qkv DIR on a whole model dump: every layer in order, each as its one-layer run,
// a model total; bad dumps refused before any backend work.
import { mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type HostTensor, hostTensor } from '@crisp/core';
import { type WritableTensor, openTensorFile, writeSafetensors } from '@crisp/io';
import { scenario } from '@crisp/synth';
import { beforeAll, describe, expect, it } from 'vitest';
import type { ModelSummary } from './model-run.js';
import type { RunSummary } from './run-job.js';
import { runCli, tempDir, testSeed } from './test-support.js';

const SEED = testSeed();
const RUN = ['--backend', 'reference', '--sample-rows', '8', '--no-gate'];
const DIMS = { n: 1280, heads: 2, kvHeads: 1, headDim: 32 };

function layerQkv(layer: number, dims = DIMS): Record<'q' | 'k' | 'v', HostTensor> {
  const sc = scenario('llama-like', { ...dims, seed: SEED + layer });
  const { q, k, v } = sc.rows(0, sc.n);
  return { q, k, v };
}

async function perLayerDir(layers: number[], meta?: string): Promise<string> {
  const dir = tempDir('crisp-model-');
  for (const l of layers) {
    await writeSafetensors(join(dir, `layer_${String(l).padStart(2, '0')}.safetensors`), layerQkv(l), meta ? { metadata: { 'crisp.layers': meta } } : {});
  }
  return dir;
}

describe('crisp run --qkv DIR (a model dump)', () => {
  let dir: string;
  let model: ModelSummary;
  beforeAll(async () => {
    dir = await perLayerDir([0, 1, 2]);
    const r = await runCli(['run', '--qkv', dir, ...RUN, '--json']);
    expect(r.code, r.stderr).toBe(0);
    model = JSON.parse(r.stdout);
    expect(r.stderr).toMatch(/layer 2 \(3\/3\)/);
  });

  it('runs every layer in order, each as its one-layer run, and totals them', async () => {
    expect(model.lines.map((l) => l.layer)).toEqual([0, 1, 2]);
    const one: RunSummary = JSON.parse((await runCli(['run', '--qkv', join(dir, 'layer_01.safetensors'), ...RUN, '--json'])).stdout);
    const l1 = model.layers[1];
    expect(l1.layer).toBe(1);
    expect(l1.policies[0].heads.map((h) => [h.route, h.density, h.massRecall])).toEqual(one.policies[0].heads.map((h) => [h.route, h.density, h.massRecall]));
    expect(model.lines[1].density).toBe(one.policies[0].density);
    expect(model.lines[1].outputError).toBeCloseTo(one.policies[0].outputError!, 12);
    const t = model.total;
    expect(t.layers).toBe(3);
    expect(t.crispMs).toBeCloseTo(model.lines.reduce((s, l) => s + l.crispMs, 0), 9);
    expect(t.speedup).toBeCloseTo(t.denseMs! / t.crispMs, 9);
    expect(t.minDensity).toBe(Math.min(...model.lines.map((l) => l.density)));
    expect(t.worstRecall.massRecall).toBe(Math.min(...model.lines.map((l) => l.massRecall)));
  });

  it('prints one line per layer and the model total; --out DIR gets one file per layer', async () => {
    const out = join(tempDir('crisp-model-out-'), 'outs');
    const r = await runCli(['run', '--qkv', dir, ...RUN, '--out', out, '--out-plan']);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.split('\n');
    for (const l of [0, 1, 2]) expect(lines.some((x) => new RegExp(`^\\s*${l}\\s+1280\\s+\\d+\\.\\d%`).test(x))).toBe(true);
    expect(r.stdout).toMatch(/^model: 3 layers; crisp .* vs dense .*x; density mean .*, min .*; worst mass recall .* \(layer \d\); worst output error/m);
    expect(readdirSync(out).sort()).toEqual(['layer_00.safetensors', 'layer_01.safetensors', 'layer_02.safetensors']);
    await using f = await openTensorFile(join(out, 'layer_02.safetensors'));
    expect(f.tensor('output').shape).toEqual([1280, 2, 32]);
    expect(f.metadata['crisp.layer']).toBe('2');
    expect(f.tensors.some((x) => x.name === 'plan.routes')).toBe(true);
  });

  it('crisp report --qkv DIR writes one page with the layers side by side', async () => {
    const page = join(tempDir('crisp-model-report-'), 'model.html');
    const r = await runCli(['report', '--qkv', dir, ...RUN, '--out', page]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/wrote .*model\.html .*3 layers, density mean/);
    const html = readFileSync(page, 'utf8');
    for (const l of [0, 1, 2]) expect(html).toContain(`<tr data-layer="${l}"><td>${l}</td><td class="num">1280</td>`);
    for (const id of ['layers-density', 'layers-time', 'layers-heads']) expect(html).toContain(`<div id="${id}"></div>`);
    expect(html.match(/<details class="layer"/g)).toHaveLength(3);
    const sweep = await runCli(['report', '--qkv', dir, ...RUN, '--out', page, '--sweep']);
    expect(sweep.code).toBe(2);
  });

  it('reads one file whose tensor names carry the layer (model.layers.N.q)', async () => {
    const d = tempDir('crisp-model-names-');
    const tensors: Record<string, WritableTensor> = {};
    for (const l of [0, 1]) for (const [role, t] of Object.entries(layerQkv(l))) tensors[`model.layers.${l}.self_attn.${role}`] = t;
    const path = join(d, 'model.safetensors');
    await writeSafetensors(path, tensors);
    const r = await runCli(['run', '--qkv', path, ...RUN, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const m: ModelSummary = JSON.parse(r.stdout);
    expect(m.lines.map((l) => l.layer)).toEqual([0, 1]);
    expect(m.lines[0].density).toBe(model.lines[0].density);
  });
});

describe('bad model dumps: a typed error before any backend work', () => {
  const refused = async (path: string, code: string, message: RegExp) => {
    const r = await runCli(['run', '--qkv', path, ...RUN]);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toContain(`error ${code}`);
    expect(r.stderr).toMatch(message);
    expect(r.stderr).not.toMatch(/layer \d+ \(\d+\/|estimate/);
  };

  it('a directory with no layers', async () => {
    await refused(tempDir('crisp-empty-'), 'FORMAT_ERROR', /no layers/);
  });

  it('gaps in the layer numbers, unless the files list the layers they hold', async () => {
    await refused(await perLayerDir([0, 2, 3]), 'FORMAT_ERROR', /missing 1; .*crisp\.layers = "0,2,3"/);
    const listed = await perLayerDir([0, 2], '0,2');
    const r = await runCli(['run', '--qkv', listed, ...RUN, '--json', '--no-dense']);
    expect(r.code, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as ModelSummary).lines.map((l) => l.layer)).toEqual([0, 2]);
  });

  it('layers of different shapes, and a layer with no v', async () => {
    const d = await perLayerDir([0]);
    await writeSafetensors(join(d, 'layer_01.safetensors'), layerQkv(1, { ...DIMS, n: 1408 }));
    await refused(d, 'SHAPE_MISMATCH', /layer 1 has n=1408, H=2, Hkv=1, d=32 but layer 0 has n=1280/);
    const nov = await perLayerDir([0]);
    const { q, k } = layerQkv(1);
    await writeSafetensors(join(nov, 'layer_01.safetensors'), { q, k });
    await refused(nov, 'FORMAT_ERROR', /layer_01\.safetensors has no v tensor/);
    const names = tempDir('crisp-names-');
    const x = hostTensor('f32', [256, 2, 32], new Float32Array(256 * 64));
    await writeSafetensors(join(names, 'm.safetensors'), { 'layers.0.q': x, 'layers.0.k': x, 'layers.0.v': x, 'layers.1.q': x, 'layers.1.k': x });
    await refused(join(names, 'm.safetensors'), 'FORMAT_ERROR', /layer 1, has no v tensor/);
  });

  it('a layer given twice, and a file whose name tells no layer', async () => {
    const d = await perLayerDir([0, 1]);
    await writeSafetensors(join(d, 'layer_1_again.safetensors'), layerQkv(1));
    await refused(d, 'FORMAT_ERROR', /layer 1 is given twice/);
    const d2 = tempDir('crisp-noname-');
    mkdirSync(join(d2, 'sub'));
    await writeSafetensors(join(d2, 'weights.safetensors'), layerQkv(0));
    await refused(d2, 'FORMAT_ERROR', /cannot tell which layer .*weights\.safetensors holds/);
  });
});
