// The READMEs' first examples, run as pasted (imports by the published names, resolved from
// this package), with what they print and return checked against float64 attention from
// @crisp/reference on the same inputs. Inputs drawn with Math.random come from a seeded
// generator here, and are drawn again in the same order for the check.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type BlockMask, type HostTensor, hostTensor, mulberry32, type Policy, type PrefillPlan, toFloat32 } from '@crisp/core';
import { crispGuarded } from '@crisp/presets';
import { attentionRows, sampleRows } from '@crisp/reference';
import { scenario } from '@crisp/synth';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { readmeBlock, runBlock } from '../../tooling/readme-snippet.js';

const repo = (path: string) => fileURLToPath(new URL(`../../${path}`, import.meta.url));
const here = fileURLToPath(new URL('.', import.meta.url));

let logs: unknown[][] = [];
let seed = 0;
const mathRandom = Math.random;
beforeEach(() => {
  logs = [];
  seed = 1 + Math.floor(Math.random() * 1e6);
  vi.spyOn(console, 'log').mockImplementation((...args: unknown[]) => {
    logs.push(args);
  });
  // assigned, not spied on: a spy records every call, and the blocks draw millions of values
  Math.random = mulberry32(seed);
});
afterEach(() => {
  Math.random = mathRandom;
  vi.restoreAllMocks();
});

/** The blocks' `random(len)`, drawn again from the same seed. */
function replay(): (len: number) => Float32Array {
  const next = mulberry32(seed);
  return (len) => Float32Array.from({ length: len }, () => next() * 2 - 1);
}

/** Every element of `rows` of `out` [n, H, d] against float64 attention over the plan's mask. */
function expectExactRows(out: HostTensor, x: { q: HostTensor; k: HostTensor; v: HostTensor }, mask: BlockMask | undefined, rows: readonly number[], tol: number) {
  const exact = attentionRows(x.q, x.k, x.v, rows, mask);
  const got = toFloat32(out);
  const width = out.shape[1] * out.shape[2];
  let worst = 0;
  rows.forEach((r, t) => {
    for (let c = 0; c < width; c++) {
      const e = exact.output[t * width + c];
      worst = Math.max(worst, Math.abs(got[r * width + c] - e) / Math.max(1, Math.abs(e)));
    }
  });
  expect(worst, `seed ${seed}`).toBeLessThan(tol);
}

describe('README.md', () => {
  it('Use it, then chunked prefill: routes, density and output rows as exact attention over the plan; one plan and LSE per chunk', async () => {
    const quickStart = readmeBlock(repo('README.md'), 'Use it');
    const chunked = readmeBlock(repo('README.md'), 'Chunked prefill against the KV cache');
    // the chunked block continues the first, before its dispose()
    expect(quickStart.endsWith('backend.dispose();\n')).toBe(true);
    const code = `${quickStart.replace(/backend\.dispose\(\);\n$/, '')}${chunked}backend.dispose();\n`;
    const r = (await runBlock(code, { resolveDir: here, returns: ['n', 'H', 'Hkv', 'd', 'plan', 'timings', 'out'] })) as {
      n: number;
      H: number;
      Hkv: number;
      d: number;
      plan: PrefillPlan;
      timings: { totalMs: number };
      out: HostTensor;
    };
    const { n, H, Hkv, d, plan, out } = r;
    const msg = `seed ${seed}`;
    // console.log(plan.routing?.routes, plan.overallDensity, timings.totalMs)
    expect(logs[0], msg).toEqual([plan.routing?.routes, plan.overallDensity, r.timings.totalMs]);
    expect(plan.routing?.routes).toHaveLength(H);
    // the comment under it: uniform random q/k route every head to PE at about 97% of the blocks
    expect(plan.routing?.routes.every((x) => x === 'pe'), msg).toBe(true);
    expect(plan.overallDensity, msg).toBeGreaterThan(0.9);
    expect(plan.overallDensity, msg).toBeLessThan(0.99);
    expect(r.timings.totalMs).toBeGreaterThan(0);
    // { dtype: 'f32', shape: [n, H, d], data: Float32Array }
    expect(out.dtype).toBe('f32');
    expect(out.shape).toEqual([n, H, d]);
    expect(out.data).toBeInstanceOf(Float32Array);
    const random = replay();
    const x = { q: hostTensor('f32', [n, H, d], random(n * H * d)), k: hostTensor('f32', [n, Hkv, d], random(n * Hkv * d)), v: hostTensor('f32', [n, Hkv, d], random(n * Hkv * d)) };
    expectExactRows(out, x, plan.mask, sampleRows(n, 32), 1e-6);
    // console.log(`[${p}, ${e}):`, plan.denseReason ?? plan.overallDensity, lse?.shape)
    const ends = [1100, 1600, n];
    expect(logs.slice(1).map((l) => [l[0], l[2]]), msg).toEqual(ends.map((e, i) => [`[${i === 0 ? 0 : ends[i - 1]}, ${e}):`, [H, e - (i === 0 ? 0 : ends[i - 1])]]));
    for (const l of logs.slice(1)) expect(typeof l[1] === 'string' || (Number(l[1]) > 0 && Number(l[1]) <= 1), msg).toBe(true);
  });
});

describe('packages/core/README.md', () => {
  it('Example: the first output values are exact attention over the plan, and f16 overflow is NON_FINITE', async () => {
    const code = readmeBlock(repo('packages/core/README.md'), 'Example');
    const { n, H, Hkv, d, plan } = (await runBlock(code, { resolveDir: here, returns: ['n', 'H', 'Hkv', 'd', 'plan'] })) as Record<string, never> & {
      plan: PrefillPlan;
    };
    const random = replay();
    const x = { q: hostTensor('bf16', [n, H, d], random(n * H * d)), k: hostTensor('bf16', [n, Hkv, d], random(n * Hkv * d)), v: hostTensor('bf16', [n, Hkv, d], random(n * Hkv * d)) };
    const [density, first] = logs[0] as [number, Float32Array];
    expect(density).toBe(plan.overallDensity);
    expect(density).toBeGreaterThan(0.9); // random inputs: near 1
    // row 0, head 0, the first 4 of d: rounded once to bf16
    const exact = attentionRows(x.q, x.k, x.v, [0], plan.mask).output.subarray(0, 4);
    const want = toFloat32(hostTensor('bf16', [4], Array.from(exact)));
    expect(Array.from(first), `seed ${seed}`).toEqual(Array.from(want));
    expect(logs[1][0]).toBe('NON_FINITE');
    expect(logs[1][1]).toMatch(/overflows f16/);
  });
});

describe('packages/router/README.md', () => {
  it('Example: C_struct and JSD route the synth layer as its truth says, head 3 (diffuse) to PE', async () => {
    const code = readmeBlock(repo('packages/router/README.md'), 'Example');
    const r = (await runBlock(code, { resolveDir: here, returns: ['stats', 'crisp', 'flex'] })) as {
      stats: { cStruct: Float64Array };
      crisp: { routes: string[]; threshold: number };
      flex: { routes: string[]; threshold: number };
    };
    expect(logs[0]).toEqual(['vs vs vs pe vs vs vs vs', 1]);
    expect(r.crisp.routes).toEqual(Array.from(r.stats.cStruct, (c) => (c >= 0.2 ? 'vs' : 'pe')));
    expect(r.crisp.threshold).toBe(0.2);
    expect(r.flex.threshold).toBe(0.1);
    const truth = scenario('llama-like', { n: 2048, heads: 8, kvHeads: 2, headDim: 64, seed: 1 }).truth;
    expect(truth.heads[3].kind).toBe('diffuse');
    expect(r.crisp.routes).toEqual(truth.heads.map((h) => h.expectedRoute));
  });
});

describe('packages/select/README.md', () => {
  it('Example: the noise floor keeps blocks 2 and 6 and the anchors', async () => {
    await runBlock(readmeBlock(repo('packages/select/README.md'), 'Example'), { resolveDir: here, returns: [] });
    expect(logs).toEqual([[[0, 2, 6, 7]]]);
  });
});

describe('packages/presets/README.md', () => {
  it('Example: the printed routes and density, and output rows as exact attention over the plan', async () => {
    const code = readmeBlock(repo('packages/presets/README.md'), 'Example');
    const { q, k, v, plan, out } = (await runBlock(code, { resolveDir: here, returns: ['q', 'k', 'v', 'plan', 'out'] })) as Record<string, HostTensor> & {
      plan: PrefillPlan;
    };
    expect(logs[0]).toEqual(['vs vs vs pe vs vs vs vs', '0.474']);
    expect(plan.routing?.routes.join(' ')).toBe(logs[0][0]);
    expectExactRows(out, { q, k, v }, plan.mask, sampleRows(4096, 32), 1e-6);
  });
});

describe('packages/presets/README.md, crispGuarded at a denser VS floor', () => {
  it('Presets: the VS heads at α 2, the PE heads\' lists at the preset\'s α 1, the rest the preset', async () => {
    const code = readmeBlock(repo('packages/presets/README.md'), 'Presets');
    const { denser } = (await runBlock(code, { resolveDir: here, returns: ['denser'] })) as { denser: Policy };
    const alpha = (x: Policy['vs']) => (x as { readonly alpha?: number } | undefined)?.alpha;
    expect(denser.name).toBe('crispGuarded-vs2');
    expect([alpha(denser.vs), alpha(denser.peVs)]).toEqual([2, alpha(crispGuarded.vs)]);
    const { name: _a, vs: _b, peVs: _c, router, pe, ...rest } = denser;
    const { name: _d, vs: _e, router: presetRouter, pe: presetPe, ...presetRest } = crispGuarded;
    expect(rest).toEqual(presetRest);
    expect([router?.name, pe?.gamma]).toEqual([presetRouter?.name, presetPe?.gamma]);
  });
});

describe('packages/synth/README.md', () => {
  it('Example: head kinds, a needle, needle recall 0.8125 and the one calibration miss it names', async () => {
    const code = readmeBlock(repo('packages/synth/README.md'), 'Example');
    const r = (await runBlock(code, { resolveDir: here, returns: ['plan', 'rep'] })) as { rep: { failures: string[] } };
    expect(logs[0][0]).toEqual(['sink-local', 'retrieval', 'retrieval', 'retrieval', 'vertical', 'diffuse', 'slash', 'retrieval']);
    expect(Object.keys(logs[1][0] as object)).toEqual(expect.arrayContaining(['position', 'length', 'readers', 'askers']));
    expect(logs[2][0]).toBe(0.8125);
    expect(r.rep.failures).toEqual(['top-1 block at the sink or local window for 87.5% of heads (< 90%)']);
  });
});

describe('packages/io/README.md', () => {
  it('Example: what it prints, and the file read back bit for bit', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'crisp-io-readme-'));
    try {
      const code = readmeBlock(repo('packages/io/README.md'), 'Example');
      expect(code).toContain("'/tmp/qkv.safetensors'");
      const r = (await runBlock(code.replaceAll("'/tmp/qkv.safetensors'", JSON.stringify(join(dir, 'qkv.safetensors'))), {
        resolveDir: here,
        returns: ['q', 'k', 'v', 'qkv'],
      })) as Record<string, HostTensor> & { qkv: Record<string, HostTensor> };
      expect(logs).toEqual([
        [{ q: 'q', k: 'k', v: 'v' }, [64, 8, 16], [64, 2, 16]],
        [['q BF16 [8,64,16]', 'k BF16 [2,64,16]', 'v BF16 [2,64,16]']],
        ['k: 16/64 rows'],
        ['k: 32/64 rows'],
        ['k: 48/64 rows'],
        ['k: 64/64 rows'],
        [[64, 2, 16]],
        [0, 32, 4096],
        [32, 32, 4096],
      ]);
      for (const t of ['q', 'k', 'v']) expect(Array.from(r.qkv[t].data)).toEqual(Array.from(r[t].data));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
