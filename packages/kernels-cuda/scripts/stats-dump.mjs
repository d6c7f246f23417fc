// The proxy statistics of one fixed input, written as raw f64 bytes, so two builds can be
// compared bit for bit on the GPU machine (session 16: the block-sum kernels' rewrite must not
// change a bit). The llama-like device fill (seed 7) at n keys, H = 32, Hkv = 8, d = 128, bf16,
// B = 128; the lean pass (deferRead, no optional statistics) and the full pass (all of them).
// Writes OUT.lean.f64 (C_struct, p_v, p_s) and OUT.full.f64 (C_struct, p_v, p_s, pooled
// estimate, row entropy).
//
//   node apps/bench/scripts/bundle.mjs packages/kernels-cuda/scripts/stats-dump.mjs .device/app/stats-dump.mjs
//   (on the GPU machine, from the repository root) node .device/app/stats-dump.mjs OUT [n] [layouts]
//   e.g. `... OUT 131072 w32,wg`: two layouts' statistics compared in one process (session 17
//   checked the overlapped lean pass, layout wgo, on branch wip/overlap-pass this way)
//   A layout with `-nopdl` after it (e.g. `wg,wg-nopdl`) runs with programmaticLaunch off: the
//   same kernels launched plainly (session 18 checked the programmatic launches this way)
import { writeFileSync } from 'node:fs';
import { CudaBackend } from '../src/cuda-backend.ts';
import { loadCuda } from '../src/ffi.ts';

const outBase = process.argv[2];
if (!outBase) throw new Error('usage: stats-dump.mjs OUT [n] [layouts]');
const n = Number(process.argv[3] ?? 131072);
// layouts (comma-separated proxyLayout values): each one's files get its name, and with two or
// more the first is compared with the others here, byte for byte
const layouts = process.argv[4] ? process.argv[4].split(',') : [undefined];
const libs = loadCuda();
const cat = (arrays) => {
  const all = new Float64Array(arrays.reduce((a, x) => a + x.length, 0));
  let at = 0;
  for (const x of arrays) {
    all.set(x, at);
    at += x.length;
  }
  return all;
};
const dumps = [];
for (const layout of layouts) {
  const plain = layout?.endsWith('-nopdl') ?? false;
  const proxyLayout = plain ? layout.slice(0, -'-nopdl'.length) : layout;
  const be = new CudaBackend(libs, {
    kernelDir: 'packages/kernels-cuda/kernels',
    cacheDir: '/tmp/crisp-cubin',
    ...(proxyLayout ? { proxyLayout } : {}),
    ...(plain ? { programmaticLaunch: false } : {}),
  });
  const q = be.allocate('bf16', [n, 32, 128]);
  const k = be.allocate('bf16', [n, 8, 128]);
  const v = be.allocate('bf16', [n, 8, 128]);
  be.fillLlamaLike(q, k, v, 7);
  const opts = { blockSize: 128, wSink: 128, wLocal: 128 };
  const lean = await be.proxyStats(q, k, { ...opts, deferRead: true, optionalStats: [] });
  const l = cat([lean.cStruct, lean.verticalBlocks, lean.slashBlocks]);
  const full = await be.proxyStats(q, k, opts);
  const f = cat([full.cStruct, full.verticalBlocks, full.slashBlocks, full.pooledEstimate, full.rowEntropy]);
  const tag = layout ? `.${layout}` : '';
  writeFileSync(`${outBase}${tag}.lean.f64`, l);
  writeFileSync(`${outBase}${tag}.full.f64`, f);
  console.log(
    `n=${n}${layout ? ` ${layout}` : ''}: lean ${l.length} values, full ${f.length} values, C_struct[0..3] ${[...full.cStruct.slice(0, 4)].map((x) => x.toFixed(6)).join(' ')}`,
  );
  dumps.push({ layout, l, f });
  be.dispose();
}
const differing = (a, b) => {
  const x = new Uint8Array(a.buffer);
  const y = new Uint8Array(b.buffer);
  let d = 0;
  for (let i = 0; i < a.length; i++) if (x.subarray(i * 8, i * 8 + 8).some((v, j) => v !== y[i * 8 + j])) d++;
  return d;
};
for (const o of dumps.slice(1)) {
  for (const key of ['l', 'f']) {
    const d = differing(dumps[0][key], o[key]);
    console.log(`${o.layout} vs ${dumps[0].layout}, ${key === 'l' ? 'lean' : 'full'}: ${d === 0 ? 'identical' : `${d} of ${o[key].length} values differ`}`);
  }
}
