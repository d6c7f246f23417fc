/**
 * Dense peers timed in the same run as CRISP's presets.
 *
 * CUDA: PyTorch scaled_dot_product_attention with the flash and cuDNN backends, through the
 * Python peer script (apps/bench/peers/sdpa_peer.py, owned by @crisp/kernels-cuda). The
 * script regenerates its inputs from a hash formula both sides share (bench.cu's
 * crisp_hash), so this module fills q/k/v with that formula on the device, runs CRISP's
 * dense kernel, saves sampled output rows for the script's cross-check, writes its
 * manifest and spawns it. Timing dense attention does not depend on the values.
 *
 * WebGPU: TensorFlow.js on WebGPU (@crisp/kernels-webgpu/tfjs-peer), dense attention as a
 * TF.js user writes it, on its own Dawn device in the same process; and ONNX Runtime Web's
 * WebGPU GroupQueryAttention (@crisp/kernels-webgpu/ort-peer), the attention a browser app
 * running an ONNX decoder gets, on the latency suite's own q/k/v (regenerated from the same
 * seed, read back from CRISP's device) and checked against CRISP's dense output.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { type Backend, type DeviceTensor, type HostTensor, f16BitsToF32 } from '@crisp/core';
import type { OpenBackend } from './backends.js';
import { type PeerName, PEERS_OF, type Shape } from './config.js';
import { type SuiteContext, timeLeft } from './context.js';
import { latencyInputs } from './inputs.js';
import { causalAttentionFlops, type Spread, spread } from './stats.js';

export interface PeerRow {
  readonly backend: string;
  readonly peer: string;
  readonly n: number;
  readonly ms: Spread;
  readonly tflops?: number;
  /** relative error of CRISP's dense output against the peer's on sampled rows */
  readonly relErrVsCrispDense?: number;
  /**
   * the peer's output was past the check's tolerance (timed anyway, as users run it): its
   * worst relative error against float64 and the tolerance
   */
  readonly beyondTolerance?: { readonly maxRelError: number; readonly tolerance: number };
  /** the run (its startedAt) that measured this row; set when results are merged */
  readonly run?: string;
}

export interface PeerNote {
  readonly backend: string;
  readonly peer: string;
  readonly status: 'ran' | 'absent' | 'failed';
  readonly detail: string;
  readonly command?: string;
}

export interface PeerResult {
  readonly rows: PeerRow[];
  readonly notes: PeerNote[];
}

interface CudaPeerHooks {
  fillHash(t: DeviceTensor, seed: number, amplitude: number): void;
  readRows(t: DeviceTensor, rows: Int32Array): HostTensor;
}

export const SDPA_PEER_SCRIPT = 'apps/bench/peers/sdpa_peer.py';

/** The peer script: --peer-script, else the repository's copy (found from the working directory). */
export function resolvePeerScript(repoRoot: string | undefined, explicit?: string): string | undefined {
  if (explicit) return resolve(explicit);
  const p = repoRoot ? join(repoRoot, SDPA_PEER_SCRIPT) : resolve(SDPA_PEER_SCRIPT);
  return existsSync(p) ? p : undefined;
}

/**
 * The SDPA peer script's arguments. It warms up as the latency suite warms up CRISP's kernels
 * (`warmup` launches, then more for at least `warmMs`), so both are timed at the clock a GPU
 * holds under load; below 256k tokens only (the script's rule: a launch takes seconds there).
 */
export function sdpaPeerArgs(script: string, manifest: string, out: string, reps: number, budgetS: number, warmup: number, warmMs: number): string[] {
  // The script drops one run at n >= 256k; ask for one more so every size keeps >= `reps`.
  return [script, '--manifest', manifest, '--out', out, '--reps', String(reps + 1), '--budget', String(budgetS), '--warmup', String(warmup), '--warm-ms', String(warmMs)];
}

async function cudaSdpaPeer(
  ctx: SuiteContext,
  b: Backend,
  sizes: readonly number[],
  shape: Shape,
  script: string,
  timing: { readonly reps: number; readonly warmup: number; readonly warmMs: number },
  budgetS: number,
): Promise<PeerResult> {
  const hooks = b as Backend & Partial<CudaPeerHooks>;
  const peerNames = ['torch-sdpa-flash', 'torch-sdpa-cudnn'];
  const note = (status: PeerNote['status'], detail: string, command?: string): PeerResult => ({
    rows: [],
    notes: peerNames.map((peer) => ({ backend: 'cuda', peer, status, detail, command })),
  });
  if (typeof hooks.fillHash !== 'function' || typeof hooks.readRows !== 'function') {
    return note('failed', 'the CUDA backend has no fillHash/readRows (needed to share inputs with the PyTorch peer)');
  }
  const probe = spawnSync('python3', ['-c', 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)'], { encoding: 'utf8', timeout: 120_000 });
  if (probe.status !== 0) {
    return note('absent', probe.status === 3 ? 'PyTorch is installed but sees no CUDA device' : `python3 with torch is not available (${(probe.stderr || probe.error?.message || '').trim().split('\n').pop()})`);
  }
  const dir = join(tmpdir(), `crisp-bench-peer-${process.pid}`);
  mkdirSync(dir, { recursive: true });
  const { heads: H, kvHeads: Hkv, headDim: D } = shape;
  const manifest = { H, Hkv, D, seeds: [1, 2, 3], amps: [2, 2, 1], ns: [] as number[], rows: {} as Record<string, string>, files: {} as Record<string, string[]>, probe: {} as Record<string, string> };
  try {
    for (const n of sizes) {
      let q: DeviceTensor | undefined;
      let k: DeviceTensor | undefined;
      let v: DeviceTensor | undefined;
      try {
        q = b.allocate('bf16', [n, H, D]);
        k = b.allocate('bf16', [n, Hkv, D]);
        v = b.allocate('bf16', [n, Hkv, D]);
        hooks.fillHash(q, 1, 2);
        hooks.fillHash(k, 2, 2);
        hooks.fillHash(v, 3, 1);
        const o = await b.denseAttention(q, k, v);
        const sample: number[] = [];
        for (let i = 0; i < n; i += 61) sample.push(i);
        for (let i = n - 128; i < n; i++) if (i % 61 !== 0) sample.push(i);
        const idx = Int32Array.from(sample);
        const rowsFile = join(dir, `rows_${n}.i32`);
        writeFileSync(rowsFile, idx);
        const denseFile = join(dir, `dense_${n}.bf16`);
        writeFileSync(denseFile, hooks.readRows(o.output, idx).data as Uint16Array);
        o.output.dispose();
        const probeFile = join(dir, `qprobe_${n}.bf16`);
        writeFileSync(probeFile, hooks.readRows(q, Int32Array.from([0, 1, n - 1])).data as Uint16Array);
        manifest.ns.push(n);
        manifest.rows[n] = rowsFile;
        // The script compares two saved outputs; both are CRISP's dense rows here.
        manifest.files[n] = [denseFile, denseFile];
        manifest.probe[n] = probeFile;
      } catch (e) {
        ctx.log(`  peer inputs n=${n}: ${e instanceof Error ? e.message : String(e)}`);
        break;
      } finally {
        for (const t of [q, k, v]) t?.dispose();
      }
    }
    const manifestFile = join(dir, 'manifest.json');
    writeFileSync(manifestFile, JSON.stringify(manifest));
    const outFile = join(dir, 'sdpa.json');
    const args = sdpaPeerArgs(script, manifestFile, outFile, timing.reps, budgetS, timing.warmup, timing.warmMs);
    const command = `python3 ${args.join(' ')}`;
    ctx.log(`  peer: ${command}`);
    const r = spawnSync('python3', args, { encoding: 'utf8', timeout: (budgetS + 300) * 1000, maxBuffer: 64 * 1024 * 1024 });
    if (!existsSync(outFile)) return note('failed', `the peer script wrote no results (exit ${r.status}): ${(r.stderr || '').trim().slice(-600)}`, command);
    const res = JSON.parse(readFileSync(outFile, 'utf8')) as {
      torch?: string;
      cudnn?: number;
      runs: { n: number; skipped?: string; [k: string]: unknown }[];
    };
    const rows: PeerRow[] = [];
    const notes: PeerNote[] = [];
    for (const [key, peer] of [
      ['flash', 'torch-sdpa-flash'],
      ['cudnn', 'torch-sdpa-cudnn'],
    ] as const) {
      const errors: string[] = [];
      for (const run of res.runs) {
        const m = run[key] as { ms?: number[]; tflops?: number; relErr_dense?: number; error?: string } | undefined;
        if (m?.ms?.length) rows.push({ backend: 'cuda', peer, n: run.n, ms: spread(m.ms), tflops: m.tflops, relErrVsCrispDense: m.relErr_dense });
        else if (m?.error) errors.push(`n=${run.n}: ${m.error.slice(0, 160)}`);
        else if (run.skipped) errors.push(`n=${run.n}: ${run.skipped}`);
      }
      notes.push({
        backend: 'cuda',
        peer,
        status: rows.some((x) => x.peer === peer) ? 'ran' : 'failed',
        detail: `torch ${res.torch ?? '?'}, cuDNN ${res.cudnn ?? '?'}${errors.length ? `; ${errors.join('; ')}` : res.runs.length ? '' : '; the peer script timed no size'}`,
        command,
      });
    }
    return { rows, notes };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Why size n is not started within a peer's time budget (dense attention is O(n^2): n is
 * projected from the last size timed), or undefined when it fits.
 */
function overBudget(n: number, last: { n: number; ms: number } | undefined, budgetMs: number, started: number): string | undefined {
  const projected = last ? last.ms * (n / last.n) ** 2 : 0;
  const left = budgetMs - (performance.now() - started);
  if (projected <= left && left > 0) return undefined;
  return `n=${n}: time budget (${Math.round(budgetMs / 1000)} s; projected ${Math.round(projected / 1000)} s, ${Math.round(Math.max(left, 0) / 1000)} s left)`;
}

/**
 * TF.js on WebGPU (@crisp/kernels-webgpu/tfjs-peer, loaded only here so the rest of the bench
 * never pulls TF.js in) at the sizes CRISP's dense kernel was timed, same heads and head dim,
 * f32. Sizes past the device's buffer limit, a failed float64 check or the time budget are
 * recorded in the note, never timed.
 */
async function tfjsWebgpuPeer(ctx: SuiteContext, sizes: readonly number[], shape: Shape, reps: number, warmup: number, warmMs: number, budgetMs: number): Promise<PeerResult> {
  const peer = 'tfjs-webgpu';
  let mod: typeof import('@crisp/kernels-webgpu/tfjs-peer');
  try {
    mod = await import('@crisp/kernels-webgpu/tfjs-peer');
  } catch (e) {
    return { rows: [], notes: [{ backend: 'webgpu', peer, status: 'absent', detail: `@crisp/kernels-webgpu/tfjs-peer did not load: ${e instanceof Error ? e.message : String(e)}` }] };
  }
  const rows: PeerRow[] = [];
  const skipped: string[] = [];
  let failed = false;
  let version: string | undefined;
  const started = performance.now();
  let last: { n: number; ms: number } | undefined;
  for (const n of sizes) {
    const over = overBudget(n, last, budgetMs, started);
    if (over) {
      skipped.push(over);
      continue;
    }
    let r: Awaited<ReturnType<typeof mod.timeTfjsDenseAttention>>;
    const t0 = performance.now();
    try {
      r = await mod.timeTfjsDenseAttention({ n, heads: shape.heads, kvHeads: shape.kvHeads, headDim: shape.headDim, reps, warmup, warmMs });
    } catch (e) {
      r = { failed: `n=${n}: ${e instanceof Error ? e.message : String(e)}` };
    }
    if ('medianMs' in r) last = { n, ms: performance.now() - t0 };
    if ('medianMs' in r) {
      version = r.tfjsVersion;
      rows.push({ backend: 'webgpu', peer, n, ms: spread(r.runs), tflops: r.tflops });
      ctx.log(`  peer ${peer} n=${n}: ${r.medianMs.toFixed(2)} ms (check: max rel err ${r.check.maxRelError.toExponential(1)})`);
    } else {
      const why = 'absent' in r ? r.absent : r.failed;
      if ('failed' in r) failed = true;
      skipped.push(why.startsWith('n=') ? why : `n=${n}: ${why}`);
      ctx.log(`  peer ${peer} n=${n}: ${why}`);
    }
  }
  const status: PeerNote['status'] = rows.length ? 'ran' : failed ? 'failed' : 'absent';
  const head = `TensorFlow.js ${version ?? '4.22.0'} tfjs-backend-webgpu, f32, per head matMul/scale/mask/softmax/matMul, rows checked against float64`;
  return { rows, notes: [{ backend: 'webgpu', peer, status, detail: `${head}${skipped.length ? `; ${skipped.join('; ')}` : ''}` }] };
}

/** Rows of a CRISP output the ORT peer is compared on: eight spread over n, and the last. */
export function ortCheckRows(n: number): number[] {
  return [...new Set([...Array.from({ length: 8 }, (_, j) => Math.floor((j * n) / 8)), n - 1])];
}

/** A device tensor to the host: f32 values or f16 bit patterns, as stored. */
async function hostValues(b: Backend, t: DeviceTensor): Promise<Float32Array | Uint16Array> {
  const h = await b.download(t);
  return h.data as Float32Array | Uint16Array;
}

/** Rows `rows` of an output stored as f32 values or f16 bits (`width` values a row), as f32, row after row. */
function rowValues(out: Float32Array | Uint16Array, rows: readonly number[], width: number): Float32Array {
  const values = new Float32Array(rows.length * width);
  rows.forEach((i, ri) => {
    for (let x = 0; x < width; x++) values[ri * width + x] = out instanceof Uint16Array ? f16BitsToF32(out[i * width + x]) : out[i * width + x];
  });
  return values;
}

/**
 * ONNX Runtime Web's WebGPU GroupQueryAttention (@crisp/kernels-webgpu/ort-peer, loaded only
 * here) at the sizes CRISP's dense kernel was timed: for each, the latency suite's q/k/v
 * (latencyInputs with the run's profile and seed, on the CRISP backend), CRISP's dense output
 * on ortCheckRows, then q/k/v read back to the host and handed to the peer, which checks its
 * output against float64 and against CRISP's rows before timing (relErrVsCrispDense). f16
 * where the adapter has shader-f16, else f32 on the same f16 values.
 */
async function ortWebgpuPeer(ctx: SuiteContext, b: Backend, sizes: readonly number[], shape: Shape, reps: number, warmup: number, warmMs: number, budgetMs: number): Promise<PeerResult> {
  const peer = 'ort-web-webgpu';
  let mod: typeof import('@crisp/kernels-webgpu/ort-peer');
  try {
    mod = await import('@crisp/kernels-webgpu/ort-peer');
  } catch (e) {
    return { rows: [], notes: [{ backend: 'webgpu', peer, status: 'absent', detail: `@crisp/kernels-webgpu/ort-peer did not load: ${e instanceof Error ? e.message : String(e)}` }] };
  }
  const c = ctx.config.latency;
  const { heads: H, kvHeads: Hkv, headDim: D } = shape;
  const rows: PeerRow[] = [];
  const skipped: string[] = [];
  let failed = false;
  let absent = false;
  let what: string | undefined;
  const started = performance.now();
  let last: { n: number; ms: number } | undefined;
  for (const n of sizes) {
    if (absent) break;
    const over = overBudget(n, last, budgetMs, started);
    if (over) {
      skipped.push(over);
      continue;
    }
    const t0 = performance.now();
    let r: Awaited<ReturnType<typeof mod.timeOrtAttention>>;
    let inputs: Awaited<ReturnType<typeof latencyInputs>> | undefined;
    try {
      inputs = await latencyInputs(b, c.profile, n, shape, 'f16', ctx.config.seed, c.maxHostValues, c.inputs, undefined, c.synthThreads);
      const dense = await b.denseAttention(inputs.q, inputs.k, inputs.v);
      const checkRows = ortCheckRows(n);
      const values = rowValues(await hostValues(b, dense.output), checkRows, H * D);
      dense.output.dispose();
      const [q, k, v] = [await hostValues(b, inputs.q), await hostValues(b, inputs.k), await hostValues(b, inputs.v)];
      inputs.dispose();
      inputs = undefined;
      const dtype = q instanceof Uint16Array ? 'f16' : 'f32';
      // timed past the tolerance too (ORT's f16 attention drifts past 1e-2 from 16k), with the
      // error beside the time
      r = await mod.timeOrtAttention({
        n,
        heads: H,
        kvHeads: Hkv,
        headDim: D,
        inputs: { q, k, v, dtype } as import('@crisp/kernels-webgpu/ort-peer').OrtAttentionInputs,
        expected: { rows: checkRows, values },
        reps,
        warmup,
        warmMs,
        timeBeyondTolerance: true,
      });
    } catch (e) {
      r = { failed: `n=${n}: ${e instanceof Error ? e.message : String(e)}` };
    } finally {
      inputs?.dispose();
    }
    if ('medianMs' in r) {
      last = { n, ms: performance.now() - t0 };
      what = `${r.dtype} on ${r.adapter}, onnxruntime-web ${r.ortVersion}`;
      const beyond = r.check.withinTolerance ? undefined : { maxRelError: Math.max(r.check.maxRelError, r.check.relErrVsExpected ?? 0), tolerance: r.check.tolerance };
      rows.push({ backend: 'webgpu', peer, n, ms: spread(r.runs), tflops: r.tflops, relErrVsCrispDense: r.check.relErrVsExpected, ...(beyond ? { beyondTolerance: beyond } : {}) });
      if (beyond) skipped.push(`n=${n}: timed with its output past the check's tolerance (max relative error ${beyond.maxRelError.toExponential(2)} > ${beyond.tolerance})`);
      ctx.log(`  peer ${peer} n=${n}: ${r.medianMs.toFixed(2)} ms (${r.dtype}; check: max rel err ${r.check.maxRelError.toExponential(1)} vs float64, ${r.check.relErrVsExpected?.toExponential(1)} vs CRISP dense${beyond ? `; past the tolerance ${beyond.tolerance}` : ''})`);
    } else {
      const why = 'absent' in r ? r.absent : r.failed;
      if ('failed' in r) failed = true;
      // ORT or WebGPU missing: every size would say the same
      if ('absent' in r && !why.startsWith('n=')) absent = true;
      skipped.push(why.startsWith('n=') ? why : `n=${n}: ${why}`);
      ctx.log(`  peer ${peer} n=${n}: ${why}`);
    }
  }
  const status: PeerNote['status'] = rows.length ? 'ran' : failed ? 'failed' : 'absent';
  const head = `ONNX Runtime Web ${mod.ORT_WEB_VERSION} WebGPU EP, com.microsoft GroupQueryAttention (causal, GQA), ${what ?? 'f16 where the adapter has shader-f16, else f32'}; the latency suite's q/k/v; rows checked against float64 and CRISP's dense output`;
  return { rows, notes: [{ backend: 'webgpu', peer, status, detail: `${head}${skipped.length ? `; ${skipped.join('; ')}` : ''}` }] };
}

/** A WebGPU backend whose attention kernel is the FMA one (its own Dawn device). */
export type OpenFmaBackend = () => Promise<Backend>;

const openFmaWebGpu: OpenFmaBackend = async () => {
  const { createNodeWebGpuBackend } = await import('@crisp/kernels-webgpu/node');
  return createNodeWebGpuBackend({ attentionKernel: 'fma' });
};

/** Whether a WebGPU backend runs f16 attention at this head dim on a kernel other than 'fma'. */
function runsTensorCores(b: Backend, headDim: number): boolean {
  const k = (b as { attentionKernelFor?: (dtype: 'f16' | 'f32', d: number) => string }).attentionKernelFor;
  return typeof k === 'function' && k.call(b, 'f16', headDim) !== 'fma';
}

/**
 * The WebGPU backend's own FMA kernel as a dense peer, where the backend runs the
 * tensor-core kernel (the "own FMA dense" a CRISP speed-up is quoted against): a second
 * backend on its own Dawn device with attentionKernel 'fma', the latency suite's inputs made
 * there the same way (profile, seed, fill), dense attention timed as the latency suite times
 * it (warm-up runs: `warmup`, and for at least `warmMs`), its output on ortCheckRows compared
 * with the tensor-core kernel's (relErrVsCrispDense). Absent, with the reason, where the
 * backend runs 'fma' already (its dense row is this number); `force` times it anyway (tests).
 */
export async function webgpuFmaPeer(
  ctx: SuiteContext,
  b: Backend,
  sizes: readonly number[],
  shape: Shape,
  reps: number,
  warmup: number,
  warmMs: number,
  budgetMs: number,
  opts: { readonly open?: OpenFmaBackend; readonly force?: boolean } = {},
): Promise<PeerResult> {
  const peer = 'webgpu-fma';
  if (!opts.force && !runsTensorCores(b, shape.headDim)) {
    return { rows: [], notes: [{ backend: 'webgpu', peer, status: 'absent', detail: "not run: the backend's attention kernel is 'fma' already (its dense row is this peer)" }] };
  }
  const c = ctx.config.latency;
  const { heads: H, headDim: D } = shape;
  let fb: Backend;
  try {
    fb = await (opts.open ?? openFmaWebGpu)();
  } catch (e) {
    return { rows: [], notes: [{ backend: 'webgpu', peer, status: 'absent', detail: `a second WebGPU backend with the FMA kernel did not open: ${e instanceof Error ? e.message : String(e)}` }] };
  }
  const rows: PeerRow[] = [];
  const skipped: string[] = [];
  let failed = false;
  const started = performance.now();
  let last: { n: number; ms: number } | undefined;
  try {
    for (const n of sizes) {
      const over = overBudget(n, last, budgetMs, started);
      if (over) {
        skipped.push(over);
        continue;
      }
      const t0 = performance.now();
      const made: { dispose(): void }[] = [];
      try {
        const checkRows = ortCheckRows(n);
        // the tensor-core kernel's rows, then the same inputs on the FMA backend
        const mine = await latencyInputs(b, c.profile, n, shape, 'f16', ctx.config.seed, c.maxHostValues, c.inputs, undefined, c.synthThreads);
        let want: Float32Array;
        try {
          const d = await b.denseAttention(mine.q, mine.k, mine.v);
          want = rowValues(await hostValues(b, d.output), checkRows, H * D);
          d.output.dispose();
        } finally {
          mine.dispose();
        }
        const inputs = await latencyInputs(fb, c.profile, n, shape, 'f16', ctx.config.seed, c.maxHostValues, c.inputs, undefined, c.synthThreads);
        made.push(inputs);
        const out = fb.allocate('f16', [n, H, D]);
        made.push(out);
        const once = async () => {
          const t = performance.now();
          await fb.denseAttention(inputs.q, inputs.k, inputs.v, { out });
          await fb.synchronize();
          return performance.now() - t;
        };
        for (let i = 0; i < warmup; i++) await once();
        for (const tw = performance.now(); warmMs > 0 && performance.now() - tw < warmMs; ) await once();
        const runs: number[] = [];
        for (let i = 0; i < reps; i++) runs.push(await once());
        const got = rowValues(await hostValues(fb, out), checkRows, H * D);
        let diff = 0;
        let scale = 0;
        for (let x = 0; x < want.length; x++) {
          diff = Math.max(diff, Math.abs(got[x] - want[x]));
          scale = Math.max(scale, Math.abs(want[x]));
        }
        const rel = diff / Math.max(scale, Number.MIN_VALUE);
        const ms = spread(runs);
        rows.push({ backend: 'webgpu', peer, n, ms, tflops: causalAttentionFlops(n, H, D) / (ms.median * 1e9), relErrVsCrispDense: rel });
        last = { n, ms: performance.now() - t0 };
        ctx.log(`  peer ${peer} n=${n}: ${ms.median.toFixed(2)} ms (rows ${rel.toExponential(1)} from the tensor-core kernel's)`);
      } catch (e) {
        failed = true;
        const why = `n=${n}: ${e instanceof Error ? e.message : String(e)}`;
        skipped.push(why);
        ctx.log(`  peer ${peer} ${why}`);
      } finally {
        for (const m of made) m.dispose();
      }
    }
  } finally {
    fb.dispose();
  }
  const status: PeerNote['status'] = rows.length ? 'ran' : failed ? 'failed' : 'absent';
  const head = "the WebGPU backend's FMA attention kernel (attentionKernel 'fma', its own Dawn device), f16, the latency suite's inputs made there; rows compared with the tensor-core kernel's dense output";
  return { rows, notes: [{ backend: 'webgpu', peer, status, detail: `${head}${skipped.length ? `; ${skipped.join('; ')}` : ''}` }] };
}

export async function densePeers(
  ctx: SuiteContext,
  backends: readonly OpenBackend[],
  measured: ReadonlyMap<string, readonly number[]>,
  peerScript: string | undefined,
): Promise<PeerResult> {
  const rows: PeerRow[] = [];
  const notes: PeerNote[] = [];
  const c = ctx.config.latency;
  for (const ob of backends) {
    if (!ob.backend || (ob.name !== 'cuda' && ob.name !== 'webgpu')) continue;
    const all: readonly PeerName[] = PEERS_OF[ob.name];
    // peers left out by --peers are noted and never started
    const chosen = c.peers;
    const names = chosen ? all.filter((p) => chosen.includes(p)) : all;
    for (const peer of all) if (!names.includes(peer)) notes.push({ backend: ob.name, peer, status: 'absent', detail: 'not run: not in --peers' });
    if (!names.length) continue;
    const on = (peer: PeerName) => names.includes(peer);
    const absent = (detail: string) => notes.push(...names.map((peer) => ({ backend: ob.name, peer, status: 'absent' as const, detail })));
    // The peers are timed at the sizes CRISP's dense kernel was: none (a run without the dense
    // preset, or every size skipped) leaves nothing to compare, so no peer process starts.
    const sizes = measured.get(ob.name) ?? [];
    if (!sizes.length) {
      absent(`not run: no size had CRISP's dense kernel timed on ${ob.name} (the peers are timed at those sizes; add dense to --presets)`);
      continue;
    }
    // The peers share the latency budget's length, cut to what the run's deadline leaves.
    const budgetMs = Math.min(c.budgetMs, timeLeft(ctx));
    if (budgetMs < 5_000) {
      absent(`not run: ${Math.round(Math.max(budgetMs, 0) / 1000)} s left before --deadline-s`);
      continue;
    }
    if (ob.name === 'cuda') {
      if (!peerScript) {
        absent(`peer script ${SDPA_PEER_SCRIPT} not found (pass --peer-script)`);
        continue;
      }
      const r = await cudaSdpaPeer(ctx, ob.backend, sizes, c.shape, peerScript, { reps: c.reps, warmup: c.warmup, warmMs: c.gpuWarmMs ?? 0 }, Math.round(budgetMs / 1000));
      // (one script times both backends of SDPA: the one left out is dropped here)
      rows.push(...r.rows.filter((x) => on(x.peer as PeerName)));
      notes.push(...r.notes.filter((x) => on(x.peer as PeerName)));
    } else if (ob.name === 'webgpu') {
      if (on('webgpu-fma')) {
        const f = await webgpuFmaPeer(ctx, ob.backend, sizes, c.shape, c.reps, c.warmup, c.gpuWarmMs ?? 0, budgetMs);
        rows.push(...f.rows);
        notes.push(...f.notes);
      }
      if (on('tfjs-webgpu')) {
        const r = await tfjsWebgpuPeer(ctx, sizes, c.shape, c.reps, c.warmup, c.gpuWarmMs ?? 0, Math.min(c.budgetMs, timeLeft(ctx)));
        rows.push(...r.rows);
        notes.push(...r.notes);
      }
      if (on('ort-web-webgpu')) {
        // ORT gets its own budget of the same length, cut to what the deadline leaves now.
        const ortBudgetMs = Math.min(c.budgetMs, timeLeft(ctx));
        if (ortBudgetMs < 5_000) {
          notes.push({ backend: 'webgpu', peer: 'ort-web-webgpu', status: 'absent', detail: `not run: ${Math.round(Math.max(ortBudgetMs, 0) / 1000)} s left before --deadline-s` });
        } else {
          const o = await ortWebgpuPeer(ctx, ob.backend, sizes, c.shape, c.reps, c.warmup, c.gpuWarmMs ?? 0, ortBudgetMs);
          rows.push(...o.rows);
          notes.push(...o.notes);
        }
      }
    }
  }
  return { rows, notes };
}
