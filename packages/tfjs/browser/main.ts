/**
 * The browser test page of @crisp/tfjs (src/browser.test.ts builds it with vite and loads it
 * in headless Chromium): TF.js on tfjs-backend-webgpu over the browser's navigator.gpu, then
 * crispAttention on seeded inputs with a small sparse policy and with `dense`, both on
 * TF.js's own device. What came out goes on `window.__crispTfjs` for the test to check
 * against float64 in Node. URL parameters: seed, n, H, Hkv, d.
 */
import { expandToRows } from '@crisp/core';
import { dense } from '@crisp/presets';
import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-webgpu';
import { crispAttention, tfBackendOf } from '../src/index.js';
import { type Sizes, smallCrisp, values } from '../src/test-inputs.js';

/** One crispAttention call as the page saw it. */
export interface PolicyRun {
  readonly policy: string;
  /** 'webgpu' when it ran on TF.js's device */
  readonly path: string;
  /** the CRISP backend that ran it */
  readonly backend: string;
  /** the TF.js backend the output tensor lives on */
  readonly outputOn: string;
  readonly shape: number[];
  readonly density: number;
  /** the plan's block mask in its row form (vertical-slash lists expanded), as plain arrays; null for a dense plan */
  readonly mask: { heads: number; numBlocks: number; blockSize: number; rowPtr: number[]; cols: number[] } | null;
  /** the query rows sampled, and their output values [rows.length, H, d] */
  readonly rows: number[];
  readonly out: number[];
  readonly ms: number;
}

export type PageReport =
  | { readonly ok: true; readonly tfBackend: string; readonly seed: number; readonly sizes: Sizes; readonly runs: PolicyRun[] }
  | { readonly ok: false; readonly noWebGpu?: string; readonly error?: string };

declare global {
  interface Window {
    __crispTfjs?: PageReport;
  }
}

const params = new URLSearchParams(location.search);
const num = (name: string, fallback: number) => Number(params.get(name) ?? fallback);

const status = document.getElementById('status')!;
/** the page's progress line (the browser test's hang guard watches it) */
const step = (message: string) => {
  status.textContent = message;
};

async function run(): Promise<PageReport> {
  step('requesting a WebGPU adapter');
  const adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
  if (!adapter) return { ok: false, noWebGpu: navigator.gpu ? 'navigator.gpu.requestAdapter() gave no adapter' : 'no navigator.gpu' };
  step('starting TF.js on webgpu');
  if (!(await tf.setBackend('webgpu'))) return { ok: false, error: 'tf.setBackend("webgpu") failed' };
  await tf.ready();
  const seed = num('seed', 1);
  const sizes: Sizes = { n: num('n', 1024), H: num('H', 4), Hkv: num('Hkv', 2), d: num('d', 64) };
  const host = values(seed, sizes);
  const q = tf.tensor(host.q, [sizes.n, sizes.H, sizes.d], 'float32');
  const k = tf.tensor(host.k, [sizes.n, sizes.Hkv, sizes.d], 'float32');
  const v = tf.tensor(host.v, [sizes.n, sizes.Hkv, sizes.d], 'float32');
  // rows in the sink block, at block edges, and the last
  const rows = [...new Set([0, 5, 63, 64, 200, Math.floor(sizes.n / 2) + 7, sizes.n - 65, sizes.n - 1])].filter((r) => r >= 0 && r < sizes.n);
  const runs: PolicyRun[] = [];
  for (const [policy, extra] of [
    [smallCrisp, { minSparseLength: 0 }],
    [dense, {}],
  ] as const) {
    step(`running ${policy.name}`);
    const t0 = performance.now();
    const r = await crispAttention(q, k, v, { policy, ...extra });
    const all = await r.output.data();
    const ms = performance.now() - t0;
    const row = sizes.H * sizes.d;
    const m = r.plans[0].mask;
    const bsr = m ? expandToRows(m) : undefined;
    runs.push({
      policy: policy.name,
      path: r.path,
      backend: r.backend,
      outputOn: tfBackendOf(tf, r.output) ?? 'unknown',
      shape: [...r.output.shape],
      density: r.density,
      mask: m && bsr ? { heads: m.heads, numBlocks: m.numBlocks, blockSize: m.blockSize, rowPtr: [...bsr.rowPtr], cols: [...bsr.cols] } : null,
      rows,
      out: rows.flatMap((i) => [...all.subarray(i * row, (i + 1) * row)]),
      ms,
    });
    r.output.dispose();
  }
  tf.dispose([q, k, v]);
  return { ok: true, tfBackend: tf.getBackend(), seed, sizes, runs };
}

run()
  .catch((e: unknown): PageReport => ({ ok: false, error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) }))
  .then((report) => {
    status.textContent = report.ok ? `done: ${report.runs.map((r) => `${r.policy} on ${r.path}, density ${r.density.toFixed(3)}`).join('; ')}` : `failed: ${report.noWebGpu ?? report.error}`;
    window.__crispTfjs = report;
  });
