/**
 * Kernel launches: modules compiled and loaded on first use, the kernel-parameter buffer
 * written in place, and programmatic launches (PDL) through cuLaunchKernelEx.
 */
import { posix } from 'node:path';
import { CrispError } from '@crisp/core';
import { compileCubin, kernelParamCounts, kernelSource } from './compile.js';
import { type CudaLibs, type Handle, STICKY_ERRORS, check } from './ffi.js';

/**
 * A TMA tensor map over a row-major [rows, heads, cols] tensor of 16-bit elements at device
 * address `ptr`: boxes of 64 columns (128 bytes, the 128-byte swizzle's width) × one head ×
 * `boxRows` rows, written to shared memory in that swizzle; rows past `rows` read as zeros.
 */
export interface TensorMap16 {
  readonly ptr: number;
  readonly rows: number;
  readonly heads: number;
  readonly cols: number;
  readonly boxRows: number;
}
/** One kernel argument: a device pointer, i32, f32, f64 or u64 value, or a tensor map (128 bytes by value). */
export type Arg = readonly ['p' | 'i' | 'f' | 'd' | 'u64', number] | readonly ['tmap', TensorMap16];
export const P = (x: number): Arg => ['p', x];
export const I = (x: number): Arg => ['i', x];
export const F = (x: number): Arg => ['f', x];
export const D64 = (x: number): Arg => ['d', x];
export const U64 = (x: number): Arg => ['u64', x];
export const TMAP = (x: TensorMap16): Arg => ['tmap', x];

/**
 * The kernels launched with programmatic stream serialisation (programmaticLaunch): each
 * starts with CRISP_PDL_ENTRY (kernels/common/crisp-common.cuh), the device-side wait for the
 * kernel before it, so a launch may overlap that kernel's last moments without reading or
 * writing anything early (kernels-compile.test.ts checks every one begins so). The device
 * plan's chain on the main stream: the combine, the block sums, the VS selection and the
 * expansion.
 */
export const PDL_KERNELS: ReadonlySet<string> = new Set([
  'proxy_combine',
  'proxy_fused_sums',
  'proxy_blocks_b',
  'vs_select',
  'coverage_select',
  'coverage_select_c8',
  'vs_pack',
  'expand_count',
  'exclusive_scan_sums',
  'exclusive_scan_tiles',
  'expand_write',
]);
/** CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h) */
const ATTR_PROGRAMMATIC_SERIALIZATION = 6;
/** launchCfg's bytes: CUlaunchConfig at 0 (56 bytes), its one CUlaunchAttribute at 64 (72 bytes) */
const CFG_BYTES = 192;
const CFG_ATTR = 64;

/** kernelParams: at most MAX_ARGS arguments; their pointers at bytes 0.., their values from ARG_VALUES (argMem) */
const MAX_ARGS = 64;
const ARG_VALUES = 512;
/** tensor maps (128 bytes each, 64-byte aligned) from TMAP_AREA on; at most MAX_TMAPS a launch */
const TMAP_AREA = 2048;
const MAX_TMAPS = 4;
/** cuTensorMapEncodeTiled's enums (cuda.h): UINT16, no interleave, 128-byte swizzle, 256-byte L2 promotion, zero fill */
const TMAP_UINT16 = 1;
const TMAP_SWIZZLE_128B = 3;
const TMAP_L2_256B = 3;

/** kernel files built with an architecture feature suffix (sm_90a) instead of the GPU's plain sm_XY */
const FILE_ARCH: Readonly<Record<string, string>> = { 'attention/attention-wgmma.cu': '90a', 'proxy/proxy-wgmma.cu': '90a' };
/** and the define that switches their bodies on (see kernels/common/wgmma.cuh) */
const FILE_OPTIONS: Readonly<Record<string, readonly string[]>> = {
  'attention/attention-wgmma.cu': ['-DCRISP_SM90A=1'],
  'proxy/proxy-wgmma.cu': ['-DCRISP_SM90A=1'],
};

export class Launcher {
  readonly #libs: CudaLibs;
  readonly #arch: number;
  readonly #cacheDir: string | null;
  readonly #kernelDir: string | undefined;
  readonly #modules = new Map<string, Handle>();
  /** loaded kernels by file, then name, with the dynamic shared memory each was raised to */
  readonly #functions = new Map<string, Map<string, { f: Handle; smem: number }>>();
  /** each loaded file's kernels' parameter counts (kernelParamCounts), checked at every launch */
  readonly #paramCounts = new Map<string, Map<string, number>>();
  readonly #argMem: Handle;
  readonly #argView: DataView;
  /** cuLaunchKernelEx's CUlaunchConfig and attribute (programmatic launches), or none */
  readonly #launchCfg: { mem: Handle; view: DataView } | undefined;
  /** the streams' handles as addresses, for CUlaunchConfig.hStream */
  readonly #streamAddr = new Map<unknown, bigint>();
  /** argMem's base address, and the offset of its 64-byte-aligned tensor-map area */
  readonly #argBase: bigint;
  readonly #tmapOff: number;
  /** parameter slots whose pointer a tensor map moved (put back by the next prepare) */
  readonly #movedSlots: number[] = [];
  /** milliseconds spent compiling or loading modules, by file */
  readonly compileMs: Record<string, { ms: number; cached: boolean }> = {};

  constructor(libs: CudaLibs, arch: number, cacheDir: string | null, kernelDir: string | undefined, programmatic: boolean) {
    this.#libs = libs;
    this.#arch = arch;
    this.#cacheDir = cacheDir;
    this.#kernelDir = kernelDir;
    this.#argMem = libs.koffi.alloc('uint8_t', 4096);
    this.#argView = new DataView(libs.koffi.view(this.#argMem, 4096));
    // cuLaunchKernel's kernelParams: slot i's pointer (bytes 8i) points at its value (bytes
    // ARG_VALUES + 8i). The pointers never change, so they are written once here, and a
    // launch writes only the values (no BigInt a launch on the host path).
    const base = BigInt(libs.koffi.address(this.#argMem));
    for (let i = 0; i < MAX_ARGS; i++) this.#argView.setBigUint64(i * 8, base + BigInt(ARG_VALUES + i * 8), true);
    this.#argBase = base;
    this.#tmapOff = TMAP_AREA + Number((64n - ((base + BigInt(TMAP_AREA)) % 64n)) % 64n);
    if (programmatic) {
      // The config's block y and z (1) and attribute list (one attribute, programmatic
      // serialisation allowed) are written once; a launch writes the grid, the block's x, the
      // shared bytes and the stream
      const mem = libs.koffi.alloc('uint8_t', CFG_BYTES);
      const view = new DataView(libs.koffi.view(mem, CFG_BYTES));
      view.setUint32(16, 1, true);
      view.setUint32(20, 1, true);
      view.setBigUint64(40, BigInt(libs.koffi.address(mem)) + BigInt(CFG_ATTR), true);
      view.setUint32(48, 1, true);
      view.setUint32(CFG_ATTR, ATTR_PROGRAMMATIC_SERIALIZATION, true);
      view.setUint32(CFG_ATTR + 8, 1, true);
      this.#launchCfg = { mem, view };
    }
  }

  /** whether PDL_KERNELS are launched programmatically */
  get programmatic(): boolean {
    return this.#launchCfg !== undefined;
  }

  /** A kernel, compiled and loaded on first use (#loadFn), its shared memory limit raised as needed. */
  #fn(file: string, name: string, dynSmem = 0): Handle {
    // by file, then name: no key string built a launch (a prefill's first launch runs on a
    // cold host, where each runtime path touched costs)
    let byName = this.#functions.get(file);
    if (!byName) {
      byName = new Map();
      this.#functions.set(file, byName);
    }
    let fn = byName.get(name);
    if (!fn) {
      fn = { f: this.#loadFn(file, name), smem: 0 };
      byName.set(name, fn);
    }
    // over 48 KiB, raised as a launch needs it (pe_logits' grows with d)
    if (dynSmem > 48 * 1024 && dynSmem > fn.smem) {
      // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
      check(this.#libs, this.#libs.cu.cuFuncSetAttribute(fn.f, 8, dynSmem), `cuFuncSetAttribute(${name})`);
      fn.smem = dynSmem;
    }
    return fn.f;
  }

  #loadFn(file: string, name: string): Handle {
    let mod = this.#modules.get(file);
    if (!mod) {
      const src = kernelSource(this.#kernelDir, file);
      this.#paramCounts.set(file, kernelParamCounts(src));
      let res = compileCubin(
        this.#libs,
        src,
        posix.basename(file).replace(/\.cu$/, ''),
        FILE_ARCH[file] ?? this.#arch,
        this.#cacheDir,
        FILE_OPTIONS[file],
      );
      const out = [null];
      let r = this.#libs.cu.cuModuleLoadData(out, res.cubin);
      if (r !== 0 && res.cached && !STICKY_ERRORS.has(r)) {
        // a cached cubin the driver refuses (a truncated or foreign file in the cache): compiled
        // again, and the cache entry replaced
        res = compileCubin(this.#libs, src, posix.basename(file).replace(/\.cu$/, ''), FILE_ARCH[file] ?? this.#arch, this.#cacheDir, FILE_OPTIONS[file], true);
        r = this.#libs.cu.cuModuleLoadData(out, res.cubin);
      }
      this.compileMs[file] = { ms: res.ms, cached: res.cached };
      check(this.#libs, r, `cuModuleLoadData(${file})`);
      mod = out[0];
      this.#modules.set(file, mod);
    }
    const out = [null];
    check(this.#libs, this.#libs.cu.cuModuleGetFunction(out, mod, name), `cuModuleGetFunction(${name})`);
    return out[0];
  }

  /** a stream handle's address (CUlaunchConfig.hStream), looked up once a stream */
  #addressOf(stream: unknown): bigint {
    let a = this.#streamAddr.get(stream);
    if (a === undefined) {
      a = BigInt(this.#libs.koffi.address(stream));
      this.#streamAddr.set(stream, a);
    }
    return a;
  }

  /**
   * The kernel, loaded, with `args` written into the parameter buffer and the grid checked:
   * what `submit` launches next.
   */
  prepare(file: string, name: string, grid: readonly [number, number?, number?], smem: number, args: readonly Arg[]): Handle {
    const f = this.#fn(file, name, smem);
    const want = this.#paramCounts.get(file)?.get(name);
    if (want !== undefined && want !== args.length) {
      throw new CrispError('BACKEND_ERROR', `${name} (${file}) takes ${want} arguments; the backend passed ${args.length}`);
    }
    if (args.length > MAX_ARGS) throw new CrispError('BACKEND_ERROR', `${name} takes ${args.length} arguments; launches carry at most ${MAX_ARGS}`);
    const v = this.#argView;
    for (const i of this.#movedSlots) v.setBigUint64(i * 8, this.#argBase + BigInt(ARG_VALUES + i * 8), true);
    this.#movedSlots.length = 0;
    for (let i = 0, off = ARG_VALUES; i < args.length; i++, off += 8) {
      const a = args[i];
      if (a[0] === 'tmap') {
        this.#tensorMap(i, a[1], name);
        continue;
      }
      const [t, x] = a;
      if (t === 'p' || t === 'u64') {
        // a 64-bit value as two 32-bit halves (device pointers and sizes are below 2^53)
        v.setUint32(off, x % 4294967296, true);
        v.setUint32(off + 4, Math.floor(x / 4294967296), true);
      } else if (t === 'i') v.setInt32(off, x, true);
      else if (t === 'f') v.setFloat32(off, x, true);
      else v.setFloat64(off, x, true);
    }
    const [gx, gy = 1, gz = 1] = grid;
    if (gx < 1 || gy < 1 || gz < 1 || gy > 65535 || gz > 65535) {
      throw new CrispError('LIMIT_EXCEEDED', `launch grid [${gx}, ${gy}, ${gz}] for ${name} is out of range`);
    }
    return f;
  }

  /** Encodes `map` into the next free tensor-map slot and points parameter slot `i` at it. */
  #tensorMap(i: number, map: TensorMap16, name: string): void {
    const encode = this.#libs.cu.cuTensorMapEncodeTiled;
    if (!encode) throw new CrispError('BACKEND_UNAVAILABLE', `${name} loads with TMA, which needs cuTensorMapEncodeTiled (a CUDA 12 or later driver)`);
    const j = this.#movedSlots.length;
    if (j >= MAX_TMAPS) throw new CrispError('BACKEND_ERROR', `${name} takes more than ${MAX_TMAPS} tensor maps`);
    const at = this.#argBase + BigInt(this.#tmapOff + 128 * j);
    const { ptr, rows, heads, cols, boxRows } = map;
    const r = encode(
      at,
      TMAP_UINT16,
      3,
      BigInt(ptr),
      new BigUint64Array([BigInt(cols), BigInt(heads), BigInt(rows)]),
      new BigUint64Array([BigInt(cols * 2), BigInt(heads * cols * 2)]),
      new Uint32Array([64, 1, boxRows]),
      new Uint32Array([1, 1, 1]),
      0,
      TMAP_SWIZZLE_128B,
      TMAP_L2_256B,
      0,
    );
    check(this.#libs, r, `cuTensorMapEncodeTiled(${name}: ${rows} × ${heads} × ${cols}, box ${boxRows} rows)`);
    this.#argView.setBigUint64(i * 8, at, true);
    this.#movedSlots.push(i);
  }

  /** Launches `f` (prepared) on `stream`: programmatically for PDL_KERNELS when enabled. */
  submit(f: Handle, name: string, grid: readonly [number, number?, number?], block: number, smem: number, stream: Handle): void {
    const [gx, gy = 1, gz = 1] = grid;
    const cfg = this.#launchCfg;
    if (cfg && PDL_KERNELS.has(name)) {
      const c = cfg.view;
      c.setUint32(0, gx, true);
      c.setUint32(4, gy, true);
      c.setUint32(8, gz, true);
      c.setUint32(12, block, true);
      c.setUint32(24, smem, true);
      c.setBigUint64(32, this.#addressOf(stream), true);
      check(this.#libs, this.#libs.cu.cuLaunchKernelEx!(cfg.mem, f, this.#argMem, null), `cuLaunchKernelEx(${name})`);
    } else {
      check(
        this.#libs,
        this.#libs.cu.cuLaunchKernel(f, gx, gy, gz, block, 1, 1, smem, stream, this.#argMem, null),
        `cuLaunchKernel(${name})`,
      );
    }
  }

  /** Unloads the modules (dispose). */
  unload(): void {
    for (const m of this.#modules.values()) this.#libs.cu.cuModuleUnload(m);
    this.#modules.clear();
    this.#functions.clear();
  }

  /** Frees the parameter buffer and the launch config (dispose, after unload). */
  free(): void {
    this.#libs.koffi.free(this.#argMem);
    if (this.#launchCfg) this.#libs.koffi.free(this.#launchCfg.mem);
  }
}
