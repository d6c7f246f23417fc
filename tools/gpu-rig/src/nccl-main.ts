/**
 * @crisp/parallel over NCCL on a GPU host: `node nccl-main.mjs --ranks P [--n N] [--devices D]`
 * makes an NCCL group id, starts P processes (this file with --rank r), each on CUDA device
 * r mod D, and each runs a context-parallel `crisp` prefill of the @crisp/synth llama-like
 * layer (H 8, Hkv 2, d 128, bf16) over `communicatorOver(ncclCollectives(...))` with the CUDA
 * backend. The ranks gather their output rows; rank 0 compares them, and the plan, with one
 * CUDA backend's `sparsePrefill` of the whole layer. Each process prints one JSON line; the
 * parent prints them and exits 1 if any rank failed or the output differs.
 * CRISP_NCCL_LIBRARY names libnccl.so.2 where the loader does not find it.
 *
 * `--start K` starts only ranks 0..K-1 of the P (the others never join: each started rank
 * must fail with a typed timeout after `--init-timeout-ms`, default 300,000, not hang).
 *
 * `--heads H --kv-heads Hkv` set the layer's shape (default 8 and 2; the Llama shape is 32 and
 * 8). Each rank generates only its own rows (shardFromRows over the scenario's rows), so n can
 * exceed what one process could hold whole; `--check off` skips rank 0's single-backend
 * comparison (which needs the whole layer) for such sizes. `--reps R` times R more prefills
 * after the first (each line's `prefillMs`: the ranks' wall time per prefill, from a barrier).
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { planPrefill, sparsePrefill, toFloat32 } from '@crisp/core';
import { createCudaBackend, ncclCollectives, ncclUniqueId, ncclVersion } from '@crisp/kernels-cuda';
import { bytesOf, communicatorOver, parallelPrefill, shardFromRows, unshardTensor, zigzagLayout } from '@crisp/parallel';
import { crisp } from '@crisp/presets';
import { scenario } from '@crisp/synth';

const arg = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const P = Number(arg('ranks', '2'));
const n = Number(arg('n', '32768'));
const devices = Number(arg('devices', '1'));
const rankArg = arg('rank', '');
const start = Number(arg('start', String(P)));
const initTimeoutMs = Number(arg('init-timeout-ms', '300000'));
const heads = Number(arg('heads', '8'));
const kvHeads = Number(arg('kv-heads', '2'));
const check = arg('check', 'on') !== 'off';
const reps = Number(arg('reps', '0'));

async function child(rank: number): Promise<void> {
  const t0 = performance.now();
  const id = Uint8Array.from(Buffer.from(process.env.CRISP_NCCL_ID ?? '', 'hex'));
  const device = rank % devices;
  const be = await createCudaBackend({ device });
  const sc = scenario('llama-like', { n, heads, kvHeads, headDim: 128, seed: 7, dtype: 'bf16' });
  const layout = zigzagLayout(n, P, 128);
  // this rank's rows only, one scenario call per range
  const chunks = new Map<number, ReturnType<typeof sc.rows>>();
  const rowsOf = (start: number, end: number) => {
    let c = chunks.get(start);
    if (!c) chunks.set(start, (c = sc.rows(start, end)));
    return c;
  };
  const shard = {
    q: shardFromRows(layout, rank, (a, b) => rowsOf(a, b).q),
    k: shardFromRows(layout, rank, (a, b) => rowsOf(a, b).k),
    v: shardFromRows(layout, rank, (a, b) => rowsOf(a, b).v),
  };
  chunks.clear();
  const generatedMs = performance.now() - t0;
  const comm = communicatorOver(await ncclCollectives({ rank, size: P, id, device, initTimeoutMs }));
  const joinedMs = performance.now() - t0;
  const res = await parallelPrefill(comm, be, layout, shard, crisp, { minSparseLength: 0 });
  const prefillMs: number[] = [];
  for (let i = 0; i < reps; i++) {
    await comm.allGather(new Uint8Array(1)); // every rank starts together
    const t = performance.now();
    // (its output comes back to the host: the prefill is over when it returns)
    await parallelPrefill(comm, be, layout, shard, crisp, { minSparseLength: 0 });
    prefillMs.push(performance.now() - t);
  }
  const outs = check ? await comm.allGather(bytesOf(res.output.data)) : [];
  const line: Record<string, unknown> = {
    rank,
    ranks: P,
    n,
    heads,
    kvHeads,
    device,
    generatedMs: Math.round(generatedMs),
    joinedMs: Math.round(joinedMs),
    timings: res.timings,
    prefillMs,
    traffic: res.traffic,
    communicatorTraffic: comm.traffic,
    density: res.plan.density ? Array.from(res.plan.density).reduce((a, b) => a + b, 0) / res.plan.density.length : null,
  };
  if (rank === 0 && check) {
    const { q, k, v } = sc.rows(0, n);
    const parts = outs.map((b) => ({ ...res.output, shape: [b.byteLength / 2 / (heads * 128), heads, 128] as const, data: new Uint16Array(b.slice().buffer) }));
    const whole = unshardTensor(layout, parts);
    const [qd, kd, vd] = [q, k, v].map((t) => be.upload(t));
    const single = await sparsePrefill(be, { q: qd, k: kd, v: vd }, crisp, { minSparseLength: 0 });
    const singlePlan = await planPrefill(be, { q: qd, k: kd }, crisp, { minSparseLength: 0 });
    const ref = toFloat32(await be.download(single.output));
    const got = toFloat32(whole);
    let maxAbs = 0;
    let differ = 0;
    for (let i = 0; i < ref.length; i++) {
      const d = Math.abs(ref[i] - got[i]);
      if (!(d <= maxAbs)) maxAbs = Number.isNaN(d) ? Number.POSITIVE_INFINITY : d;
      if (ref[i] !== got[i]) differ++;
    }
    line.outputsDiffering = differ;
    line.outputMaxAbsDiff = maxAbs;
    line.planRoutesEqual = JSON.stringify(res.plan.routing?.routes) === JSON.stringify(singlePlan.routing?.routes);
    line.planMaskEqual = JSON.stringify(res.plan.mask) === JSON.stringify(singlePlan.mask);
    line.ok = line.planRoutesEqual === true && line.planMaskEqual === true && maxAbs <= 1e-2;
    if (!line.ok) process.exitCode = 1;
  }
  comm.close();
  be.dispose();
  console.log(JSON.stringify(line));
}

async function parent(): Promise<void> {
  console.log(JSON.stringify({ nccl: ncclVersion(), ranks: P, started: Math.min(start, P), n, heads, kvHeads, devices, check, reps }));
  const id = Buffer.from(ncclUniqueId()).toString('hex');
  const self = fileURLToPath(import.meta.url);
  const codes = await Promise.all(
    Array.from(
      { length: Math.min(start, P) },
      (_, r) =>
        new Promise<number>((resolve) => {
          const args = ['--rank', String(r), '--ranks', String(P), '--n', String(n), '--devices', String(devices), '--init-timeout-ms', String(initTimeoutMs)];
          args.push('--heads', String(heads), '--kv-heads', String(kvHeads), '--check', check ? 'on' : 'off', '--reps', String(reps));
          const c = spawn(process.execPath, [self, ...args], {
            env: { ...process.env, CRISP_NCCL_ID: id },
            stdio: ['ignore', 'inherit', 'inherit'],
          });
          c.on('close', (code) => resolve(code ?? 1));
        }),
    ),
  );
  console.log(JSON.stringify({ exitCodes: codes }));
  process.exitCode = codes.every((c) => c === 0) ? 0 : 1;
}

if (rankArg === '') {
  await parent();
} else {
  const rank = Number(rankArg);
  try {
    await child(rank);
  } catch (e) {
    console.log(JSON.stringify({ rank, error: e instanceof Error ? e.message : String(e), code: (e as { code?: string }).code, details: (e as { details?: unknown }).details }));
    process.exitCode = 1;
  }
}
