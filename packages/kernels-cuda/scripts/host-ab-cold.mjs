// Two builds' host paths in one process on the stand-in driver (no GPU): each prefill after a
// 30 ms host sleep (as after an attention's synchronize), the time from sparsePrefill's call to
// its first launch's driver call, alternated and paired. Session 23: a local guide before a
// paired run on the H200 (host-ab-gpu.mjs), which alone says what the device sees.
//   bash apps/bench/scripts/host-ab-pack.sh BASE NEW
//   node .device/app/host-ab-cold.mjs .device/app/ab-BASE.mjs .device/app/ab-NEW.mjs [pairs=300] [warm=2000]
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { sparsePrefill } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { llamaLayer } from './gpu-layer.mjs';

const [pa, pb] = process.argv.slice(2, 4);
const pairs = Number(process.argv[4] ?? 300);
const warm = Number(process.argv[5] ?? 2000);
const sleepMs = Number(process.env.SLEEP_MS ?? 30);
const A = await import(pathToFileURL(resolve(pa)).href);
const B = await import(pathToFileURL(resolve(pb)).href);
const sab = new Int32Array(new SharedArrayBuffer(4));
const builds = [A, B].map((M, i) => {
  const si = M.standInDriver({ heads: 32 });
  const be = new M.CudaBackend(si.libs, { cacheDir: null });
  return { name: 'AB'[i], M, si, be, layer: llamaLayer(be, 131072), t: [] };
});
const once = async (b, keep) => {
  await b.be.synchronize();
  if (keep && sleepMs > 0) Atomics.wait(sab, 0, 0, sleepMs);
  b.si.log.length = 0;
  const t0 = performance.now();
  await (b.M.sparsePrefill ?? sparsePrefill)(b.be, b.layer.inputs, b.M.crisp ?? crisp, { minSparseLength: 0, out: b.layer.out });
  const first = b.si.log.find((e) => e.kind === 'launch');
  if (keep) b.t.push((first.at - t0) * 1000);
};
for (let i = 0; i < warm; i++) for (const b of builds) await once(b, false);
for (let i = 0; i < pairs; i++) for (const b of i % 2 ? [builds[1], builds[0]] : builds) await once(b, true);
const med = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const [a, b] = builds;
console.log(`A ${med(a.t).toFixed(1)} us, B ${med(b.t).toFixed(1)} us to the first launch (medians of ${pairs}, ${sleepMs} ms sleep before each); B − A paired ${med(b.t.map((x, i) => x - a.t[i])).toFixed(1)} us`);
