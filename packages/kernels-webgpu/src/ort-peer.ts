/// <reference types="@webgpu/types" preserve="true" />
/**
 * The ONNX Runtime Web attention peer (entry `@crisp/kernels-webgpu/ort-peer`, Node or
 * browser): causal GQA attention as a browser app runs it, ONNX Runtime Web's WebGPU execution
 * provider on a one-node `com.microsoft` GroupQueryAttention graph generated in code (see
 * onnx-graph.ts for why that op), f16 where the adapter has `shader-f16`, else f32.
 *
 * In Node the GPU is Dawn from the `webgpu` package, as for the rest of this package. ORT-web
 * checks `navigator.gpu` once when its WebGPU backend starts, so navigator.gpu is lent while
 * sessions are created and put back afterwards; the device is made here and handed to ORT
 * (`executionProviders: [{ name: 'webgpu', device }]`), so the peer knows the device it times.
 * ORT's WebAssembly memory is shared (threaded build) and dawn.node rejects writeBuffer from a
 * SharedArrayBuffer view ("Invalid argument"), so that device's queue copies such views first.
 *
 * Inputs are the caller's host q, k, v ([n, H, d], [n, H_kv, d], f16 bits or f32), uploaded once
 * to GPU buffers that ORT reads in place (Tensor.fromGpuBuffer); the output goes to a GPU
 * buffer made here. A run is timed from session.run to the queue's onSubmittedWorkDone (q, k, v
 * on the device to the output on the device, as CRISP's latency rows). Before any timing the
 * output buffer is filled with NaN, the checked rows are compared with float64 attention on the
 * same inputs and, when given, with the caller's expected rows (CRISP's dense output); after
 * the timed runs (each behind a fresh NaN fill) the same rows are read again and must be the
 * checked ones, so a run that wrote nothing is never timed.
 *
 * "Cannot run here" (no onnxruntime-web, no WebGPU adapter, ORT's WebGPU backend does not
 * start, n beyond a buffer limit) comes back as `{ absent: reason }`, a wrong or crashing run
 * as `{ failed: reason }`; only bad arguments throw (CrispError INVALID_ARGUMENT).
 *
 * @module @crisp/kernels-webgpu/ort-peer
 */
import { CrispError, decode, encode } from '@crisp/core';
import { GQA_INPUTS, GQA_OUTPUT, gqaModel } from './onnx-graph.js';
import { positiveInt as checkedInt, errText, keepAlive, nonNegativeMs, type PeerTimes, peerTimes, warmUp, webgpuEntry, withNavigatorGpu } from './peer-support.js';

export const ORT_WEB_VERSION = '1.30.0';

export interface OrtAttentionInputs {
  /** [n, H, d] row-major (the same as q [1, n, H·d]) */
  readonly q: Float32Array | Uint16Array;
  /** [n, H_kv, d] */
  readonly k: Float32Array | Uint16Array;
  readonly v: Float32Array | Uint16Array;
  /** how q, k, v are stored: f32 values or f16 bit patterns */
  readonly dtype: 'f32' | 'f16';
}

export interface OrtAttentionOptions {
  /** a WebGPU entry point; default navigator.gpu, else Dawn (the webgpu package) */
  readonly gpu?: GPU;
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly inputs: OrtAttentionInputs;
  /** what ORT computes in: 'auto' (default) is f16 where the adapter has shader-f16, else f32 */
  readonly dtype?: 'auto' | 'f16' | 'f32';
  /** CRISP's dense output on some rows: `values` is [rows.length, H, d] in f32 */
  readonly expected?: { readonly rows: readonly number[]; readonly values: Float32Array };
  /** timed runs (default 3) */
  readonly reps?: number;
  /** untimed runs first (default 1) */
  readonly warmup?: number;
  /**
   * then untimed runs until this many ms have passed (default 0): crisp-bench passes the time
   * it warms CRISP's kernels up for, so both are timed at the clock the GPU holds under load
   */
  readonly warmMs?: number;
  /** largest relative error accepted, against float64 and against `expected` (default 2e-3 for f32, 1e-2 for f16) */
  readonly tolerance?: number;
  /**
   * time the operator even when its output is past `tolerance` (the result's
   * `check.withinTolerance` says so); default false: such a size fails untimed
   */
  readonly timeBeyondTolerance?: boolean;
}

export interface OrtAttentionTiming extends PeerTimes {
  readonly n: number;
  readonly dtype: 'f16' | 'f32';
  readonly check: {
    /** worst max|o − ref| / max(max|ref|, 1e-3) against float64 attention, over the checked (head, row) pairs */
    readonly maxRelError: number;
    readonly rows: number[];
    readonly heads: number[];
    /** the same measure against `expected` (all heads of its rows), when given */
    readonly relErrVsExpected?: number;
    /** both errors within the tolerance (false only with `timeBeyondTolerance`) */
    readonly withinTolerance: boolean;
    readonly tolerance: number;
  };
  readonly ortVersion: string;
  readonly adapter: string;
}

export interface OrtAbsent {
  readonly absent: string;
}

export interface OrtFailed {
  readonly failed: string;
}

export type OrtAttentionResult = OrtAttentionTiming | OrtAbsent | OrtFailed;

type Ort = typeof import('onnxruntime-web');
type Session = import('onnxruntime-web').InferenceSession;

interface Started {
  readonly ort: Ort;
  readonly gpu: GPU;
  readonly device: GPUDevice;
  readonly f16: boolean;
  readonly adapter: string;
  readonly sessions: Map<string, Promise<Session | OrtAbsent>>;
}

const started = new Map<GPU | undefined, Promise<Started | OrtAbsent>>();

/**
 * Features ORT's WebGPU EP uses when it makes its own device, where the adapter has them.
 * `subgroups` only where the adapter's smallest subgroup is 16 or more (the size ORT's
 * FlashAttention was written for): on SwiftShader (subgroups of 4) its subgroup shader gave
 * wrong rows (max relative error 1.7 at n = 256), the shared-memory one right ones.
 */
const MIN_SUBGROUP = 16;
const WANTED_FEATURES = ['shader-f16', 'timestamp-query', 'float32-filterable', 'chromium-experimental-subgroup-matrix'];
/** Limits raised to the adapter's, as ORT does for its own device (large buffers, big workgroups). */
const WANTED_LIMITS = [
  'maxBufferSize',
  'maxStorageBufferBindingSize',
  'maxStorageBuffersPerShaderStage',
  'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup',
  'maxComputeWorkgroupSizeX',
  'maxComputeWorkgroupSizeY',
  'maxComputeWorkgroupSizeZ',
  'maxComputeWorkgroupsPerDimension',
] as const;

/**
 * dawn.node's writeBuffer throws "Invalid argument" for a view of a SharedArrayBuffer, which
 * is where ORT's threaded WebAssembly keeps uniforms and host inputs: copy those first.
 */
function copySharedWrites(device: GPUDevice): void {
  const queue = device.queue;
  const write = queue.writeBuffer.bind(queue);
  const shared = typeof SharedArrayBuffer === 'undefined' ? undefined : SharedArrayBuffer;
  queue.writeBuffer = ((buffer: GPUBuffer, offset: number, data: ArrayBufferView | ArrayBuffer, dataOffset?: number, size?: number) => {
    if (shared && ArrayBuffer.isView(data) && data.buffer instanceof shared) {
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      const per = (data as unknown as { BYTES_PER_ELEMENT?: number }).BYTES_PER_ELEMENT ?? 1;
      const start = (dataOffset ?? 0) * per;
      const end = size === undefined ? bytes.length : start + size * per;
      return write(buffer, offset, bytes.slice(start, end));
    }
    return write(buffer, offset, data as GPUAllowSharedBufferSource, dataOffset, size);
  }) as GPUQueue['writeBuffer'];
}

/** ORT-web's WebGPU build and a device for it, once per WebGPU entry point. */
export function startOrtWebGpu(gpu?: GPU): Promise<Started | OrtAbsent> {
  let p = started.get(gpu);
  if (!p) {
    p = (async (): Promise<Started | OrtAbsent> => {
      // (in Node ORT-web reads GPUBufferUsage, GPUDevice & co. from globalThis)
      const entry = await webgpuEntry(gpu);
      if (typeof entry === 'string') return { absent: entry };
      let adapter: GPUAdapter | null;
      try {
        adapter = await entry.requestAdapter({ powerPreference: 'high-performance' });
      } catch (e) {
        return { absent: `requestAdapter failed: ${errText(e)}` };
      }
      if (!adapter) return { absent: 'no WebGPU adapter (for Dawn on Linux: a Vulkan driver, or VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json for SwiftShader)' };
      const a = adapter;
      let device: GPUDevice;
      try {
        const requiredLimits: Record<string, number> = {};
        for (const k of WANTED_LIMITS) if (typeof a.limits[k] === 'number') requiredLimits[k] = a.limits[k];
        const minSubgroup = (a.info as { subgroupMinSize?: number } | undefined)?.subgroupMinSize ?? 0;
        const features = [...WANTED_FEATURES, ...(minSubgroup >= MIN_SUBGROUP ? ['subgroups'] : [])].filter((f) => a.features.has(f));
        device = await a.requestDevice({ requiredFeatures: features as GPUFeatureName[], requiredLimits });
      } catch (e) {
        return { absent: `requestDevice failed: ${errText(e)}` };
      }
      keepAlive(device);
      copySharedWrites(device);
      let ort: Ort;
      try {
        const pkg = 'onnxruntime-web/webgpu';
        ort = (await import(/* @vite-ignore */ pkg)) as Ort;
      } catch (e) {
        return { absent: `onnxruntime-web did not load (install onnxruntime-web@${ORT_WEB_VERSION}): ${errText(e)}` };
      }
      // The attention runs on the GPU; ORT's CPU threads would only start workers for nothing.
      ort.env.wasm.numThreads = 1;
      ort.env.logLevel = 'error';
      const info = a.info;
      return {
        ort,
        gpu: entry,
        device,
        f16: device.features.has('shader-f16'),
        adapter: `${[info?.vendor, info?.architecture, info?.description].filter(Boolean).join(' / ') || 'unknown adapter'}${device.features.has('subgroups') ? ', subgroups' : ''}`,
        sessions: new Map(),
      };
    })();
    started.set(gpu, p);
  }
  return p;
}

function session(s: Started, heads: number, kvHeads: number, headDim: number, dtype: 'f16' | 'f32'): Promise<Session | OrtAbsent> {
  const key = `${heads}/${kvHeads}/${headDim}/${dtype}`;
  let p = s.sessions.get(key);
  if (!p) {
    p = withNavigatorGpu(s.gpu, async () => {
      try {
        return await s.ort.InferenceSession.create(gqaModel({ heads, kvHeads, headDim, dtype }), {
          executionProviders: [{ name: 'webgpu', device: s.device } as unknown as 'webgpu'],
          preferredOutputLocation: 'gpu-buffer',
        });
      } catch (e) {
        return { absent: `ONNX Runtime Web's WebGPU execution provider did not start: ${errText(e)}` };
      }
    });
    s.sessions.set(key, p);
  }
  return p;
}

const positiveInt = (name: string, x: unknown, min = 1) => checkedInt('timeOrtAttention', name, x, min);

/** float64 causal attention of query row i, head h (group g), over keys 0..i; q holds that row's H·d values. */
function referenceRow(q: Float32Array, k: Float32Array, v: Float32Array, i: number, h: number, g: number, Hkv: number, d: number): Float64Array {
  const scale = 1 / Math.sqrt(d);
  const qo = h * d;
  const s = new Float64Array(i + 1);
  let m = Number.NEGATIVE_INFINITY;
  for (let j = 0; j <= i; j++) {
    const ko = (j * Hkv + g) * d;
    let acc = 0;
    for (let c = 0; c < d; c++) acc += q[qo + c] * k[ko + c];
    s[j] = acc * scale;
    if (s[j] > m) m = s[j];
  }
  const out = new Float64Array(d);
  let z = 0;
  for (let j = 0; j <= i; j++) {
    const p = Math.exp(s[j] - m);
    z += p;
    const vo = (j * Hkv + g) * d;
    for (let c = 0; c < d; c++) out[c] += p * v[vo + c];
  }
  for (let c = 0; c < d; c++) out[c] /= z;
  return out;
}

/** max|got − ref| / max(max|ref|, 1e-3); a non-finite value counts as infinite error. */
function relError(got: ArrayLike<number>, gotOffset: number, ref: ArrayLike<number>, refOffset: number, len: number): number {
  let amax = 0;
  let err = 0;
  for (let c = 0; c < len; c++) {
    const r = ref[refOffset + c];
    const x = got[gotOffset + c];
    amax = Math.max(amax, Math.abs(r));
    err = Math.max(err, Number.isFinite(x) ? Math.abs(x - r) : Number.POSITIVE_INFINITY);
  }
  return err / Math.max(amax, 1e-3);
}

// (core's decode / encode: plain loops. `TypedArray.from(typed, fn)` would first list every
// value in a JS array, which V8 refuses past 2^27 elements: q at n = 32k, H 32, d 128.)
const toF32 = (x: Float32Array | Uint16Array, from: 'f16' | 'f32'): Float32Array => decode(from, x);
const toF16 = (x: Float32Array | Uint16Array, from: 'f16' | 'f32'): Uint16Array => (from === 'f16' ? (x as Uint16Array) : (encode('f16', x) as Uint16Array));

/** Writes `pattern` (one element's bytes) over the whole buffer, in chunks. */
function fill(device: GPUDevice, buf: GPUBuffer, bytes: number, elem: Uint8Array): void {
  const chunk = Math.min(bytes, 1 << 24);
  const data = new Uint8Array(chunk);
  for (let o = 0; o < chunk; o += elem.length) data.set(elem, o);
  for (let o = 0; o < bytes; o += chunk) device.queue.writeBuffer(buf, o, data, 0, Math.min(chunk, bytes - o));
}

/** Rows `rows` of an [n, H·d] buffer to the host as f32 ([rows.length, H·d]). */
async function readRows(device: GPUDevice, buf: GPUBuffer, rows: readonly number[], rowElems: number, dtype: 'f16' | 'f32'): Promise<Float32Array> {
  const es = dtype === 'f16' ? 2 : 4;
  const rowBytes = rowElems * es;
  const staging = device.createBuffer({ size: rows.length * rowBytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  try {
    const enc = device.createCommandEncoder();
    for (const [i, r] of rows.entries()) enc.copyBufferToBuffer(buf, r * rowBytes, staging, i * rowBytes, rowBytes);
    device.queue.submit([enc.finish()]);
    await staging.mapAsync(mapRead());
    const raw = staging.getMappedRange().slice(0);
    staging.unmap();
    return dtype === 'f16' ? toF32(new Uint16Array(raw), 'f16') : new Float32Array(raw);
  } finally {
    staging.destroy();
  }
}

const mapRead = () => (globalThis as unknown as { GPUMapMode: { READ: number } }).GPUMapMode.READ;

/**
 * Times ORT-web's GroupQueryAttention on WebGPU over the given q, k, v. Never throws for "cannot
 * run here"; throws CrispError INVALID_ARGUMENT for bad sizes or inputs.
 */
export async function timeOrtAttention(opts: OrtAttentionOptions): Promise<OrtAttentionResult> {
  const n = positiveInt('n', opts.n);
  const H = positiveInt('heads', opts.heads);
  const Hkv = positiveInt('kvHeads', opts.kvHeads);
  const d = positiveInt('headDim', opts.headDim);
  const reps = positiveInt('reps', opts.reps ?? 3);
  const warmup = positiveInt('warmup', opts.warmup ?? 1, 0);
  const warmMs = nonNegativeMs('timeOrtAttention', 'warmMs', opts.warmMs ?? 0);
  if (H % Hkv !== 0) throw new CrispError('INVALID_ARGUMENT', `timeOrtAttention: heads (${H}) must be a multiple of kvHeads (${Hkv})`);
  if (d % 4 !== 0) throw new CrispError('INVALID_ARGUMENT', `timeOrtAttention: headDim (${d}) must be a multiple of 4`);
  const inp = opts.inputs;
  for (const [name, x, len] of [
    ['q', inp?.q, n * H * d],
    ['k', inp?.k, n * Hkv * d],
    ['v', inp?.v, n * Hkv * d],
  ] as const) {
    const ok = inp?.dtype === 'f16' ? x instanceof Uint16Array : inp?.dtype === 'f32' && x instanceof Float32Array;
    if (!ok || x.length !== len) {
      throw new CrispError('INVALID_ARGUMENT', `timeOrtAttention: inputs.${name} must be a ${inp?.dtype === 'f16' ? 'Uint16Array' : 'Float32Array'} of ${len} values (inputs.dtype ${String(inp?.dtype)})`);
    }
  }
  const exp = opts.expected;
  if (exp && (exp.values.length !== exp.rows.length * H * d || exp.rows.some((r) => !Number.isInteger(r) || r < 0 || r >= n))) {
    throw new CrispError('INVALID_ARGUMENT', 'timeOrtAttention: expected.values must be [rows.length, H, d] and every row in 0..n-1');
  }

  const s = await startOrtWebGpu(opts.gpu);
  if ('absent' in s) return s;
  const want = opts.dtype ?? 'auto';
  if (want === 'f16' && !s.f16) return { absent: `f16 asked for, and the adapter (${s.adapter}) has no shader-f16` };
  const dtype: 'f16' | 'f32' = want === 'auto' ? (s.f16 ? 'f16' : 'f32') : want;
  const tolerance = opts.tolerance ?? (dtype === 'f16' ? 1e-2 : 2e-3);
  const es = dtype === 'f16' ? 2 : 4;
  const limit = Math.min(s.device.limits.maxStorageBufferBindingSize, s.device.limits.maxBufferSize);
  if (n * H * d * es > limit) {
    return { absent: `n=${n}: q (${((n * H * d * es) / 2 ** 30).toFixed(2)} GiB) exceeds the device's buffer limit (${(limit / 2 ** 30).toFixed(2)} GiB)` };
  }
  const sess = await session(s, H, Hkv, d, dtype);
  if ('absent' in sess) return sess;

  const { ort, device } = s;
  const ortType = dtype === 'f16' ? 'float16' : 'float32';
  // The values ORT gets, for the float64 reference.
  const data = (x: Float32Array | Uint16Array) => (dtype === 'f16' ? toF16(x, inp.dtype) : toF32(x, inp.dtype));
  const host = { q: data(inp.q), k: data(inp.k), v: data(inp.v) };
  const buffers: GPUBuffer[] = [];
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  try {
    const upload = (x: Float32Array | Uint16Array) => {
      const b = device.createBuffer({ size: Math.ceil(x.byteLength / 4) * 4, usage });
      buffers.push(b);
      device.queue.writeBuffer(b, 0, x.buffer, x.byteOffset, x.byteLength);
      return b;
    };
    const tensor = (b: GPUBuffer, width: number) => ort.Tensor.fromGpuBuffer(b, { dataType: ortType, dims: [1, n, width] });
    const feeds = {
      [GQA_INPUTS.q]: tensor(upload(host.q), H * d),
      [GQA_INPUTS.k]: tensor(upload(host.k), Hkv * d),
      [GQA_INPUTS.v]: tensor(upload(host.v), Hkv * d),
      [GQA_INPUTS.seqlensK]: new ort.Tensor('int32', Int32Array.of(n - 1), [1]),
      [GQA_INPUTS.totalSequenceLength]: new ort.Tensor('int32', Int32Array.of(n), [1]),
    };
    const out = device.createBuffer({ size: n * H * d * es, usage });
    buffers.push(out);
    const fetches = { [GQA_OUTPUT]: tensor(out, H * d) };
    // NaN in every element: f16 0x7e00, f32 0x7fc00000 (little-endian)
    const nan = dtype === 'f16' ? Uint8Array.of(0x00, 0x7e) : Uint8Array.of(0x00, 0x00, 0xc0, 0x7f);
    const poison = () => fill(device, out, n * H * d * es, nan);
    const run = async () => {
      await sess.run(feeds, fetches);
      await device.queue.onSubmittedWorkDone();
    };

    // The check, on a poisoned output: rows 0, n/2, n-1 (one key, half, all) and the expected rows.
    const rows = [...new Set([0, Math.floor(n / 2), n - 1, ...(exp?.rows ?? [])])].sort((a, b) => a - b);
    const heads = [...new Set([0, H - 1])];
    poison();
    await run();
    const got = await readRows(device, out, rows, H * d, dtype);
    // k and v widened whole; of q only the checked rows
    const ref = { k: toF32(host.k, dtype), v: toF32(host.v, dtype) };
    let worst = 0;
    rows.forEach((i, ri) => {
      const qRow = toF32(host.q.subarray(i * H * d, (i + 1) * H * d), dtype);
      for (const h of heads) {
        const r = referenceRow(qRow, ref.k, ref.v, i, h, Math.floor(h / (H / Hkv)), Hkv, d);
        worst = Math.max(worst, relError(got, (ri * H + h) * d, r, 0, d));
      }
    });
    let vsExpected: number | undefined;
    if (exp) {
      vsExpected = 0;
      exp.rows.forEach((i, ei) => {
        const ri = rows.indexOf(i);
        for (let h = 0; h < H; h++) vsExpected = Math.max(vsExpected ?? 0, relError(got, (ri * H + h) * d, exp.values, (ei * H + h) * d, d));
      });
    }
    const within = worst <= tolerance && (vsExpected === undefined || vsExpected <= tolerance);
    const check = { maxRelError: worst, rows, heads, ...(vsExpected !== undefined ? { relErrVsExpected: vsExpected } : {}), withinTolerance: within, tolerance };
    // NaN is never within tolerance, and never timed
    const finite = Number.isFinite(worst) && (vsExpected === undefined || Number.isFinite(vsExpected));
    if (!within && !(opts.timeBeyondTolerance === true && finite)) {
      return !(worst <= tolerance)
        ? { failed: `n=${n}: ORT output failed the float64 check (max relative error ${worst.toExponential(2)} > ${tolerance}); not timed` }
        : { failed: `n=${n}: ORT output differs from the expected rows (max relative error ${(vsExpected ?? Number.NaN).toExponential(2)} > ${tolerance}); not timed` };
    }

    const warmupRuns = await warmUp(run, warmup, warmMs);
    const runs: number[] = [];
    for (let r = 0; r < reps; r++) {
      poison();
      await device.queue.onSubmittedWorkDone();
      const t0 = performance.now();
      await run();
      runs.push(performance.now() - t0);
    }
    const again = await readRows(device, out, rows, H * d, dtype);
    if (again.some((x, i) => !(x === got[i]))) {
      return { failed: `n=${n}: the last timed run did not write the checked output (poison or other values found); not reported` };
    }
    return {
      n,
      ...peerTimes(runs, n, H, d, warmupRuns),
      dtype,
      check,
      ortVersion: ort.env.versions?.web ?? ORT_WEB_VERSION,
      adapter: s.adapter,
    };
  } catch (e) {
    return { failed: `n=${n}: ONNX Runtime Web failed: ${errText(e)}` };
  } finally {
    for (const b of buffers) b.destroy();
  }
}
