/**
 * NVRTC compilation with an on-disk cubin cache. Kernel sources are the package's
 * `kernels/<role>/*.cu` files (named by their path under kernels/, e.g. `proxy/proxy.cu`),
 * embedded in the build (kernel-sources.generated.ts) unless a `kernelDir` is given; their
 * `#include "../common/crisp-common.cuh"` lines are spliced in here so NVRTC needs no include
 * paths. Cache key: sha256 of (source, options, architecture, NVRTC version).
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CrispError } from '@crisp/core';
import type { CudaLibs } from './ffi.js';
import { KERNEL_SOURCES } from '../kernel-sources.generated.js';

/**
 * The folder holding the shipped .cu sources (next to src/ and dist/; the build embeds the same
 * text). UNSUPPORTED inside a CommonJS bundle, where this module has no file of its own (and no
 * kernels/ folder beside it): leave `kernelDir` unset there, and the embedded sources are used.
 */
export function defaultKernelDir(): string {
  if (!import.meta.url) {
    throw new CrispError('UNSUPPORTED', 'defaultKernelDir: this code runs from a CommonJS bundle, which has no kernels/ folder beside it; leave kernelDir unset to compile the embedded sources');
  }
  return fileURLToPath(new URL('../../kernels/', import.meta.url));
}

export function defaultCacheDir(): string {
  const base = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
  return join(base, 'crisp', 'cuda');
}

/**
 * A kernel file with its includes spliced in (one level: the common headers): from `kernelDir`
 * when given (a folder of edited sources), otherwise the sources embedded in the build, which
 * need no file next to the code (an application bundle carries them).
 */
export function kernelSource(kernelDir: string | undefined, file: string): string {
  const read = (name: string): string => {
    if (kernelDir === undefined) {
      const src = Object.hasOwn(KERNEL_SOURCES, name) ? KERNEL_SOURCES[name] : undefined;
      if (src === undefined) throw new CrispError('BACKEND_UNAVAILABLE', `CUDA kernel source ${name} is not among the embedded kernels (${Object.keys(KERNEL_SOURCES).join(', ')})`);
      return src;
    }
    try {
      return readFileSync(join(kernelDir, name), 'utf8');
    } catch (e) {
      throw new CrispError(
        'BACKEND_UNAVAILABLE',
        `CUDA kernel source ${name} not found in ${kernelDir} (${(e as Error).message}); kernelDir must hold the package's kernels/ files (leave it unset to compile the embedded ones)`,
      );
    }
  };
  // include paths are relative to the including file's folder ("../common/crisp-common.cuh")
  const dir = posix.dirname(file);
  return read(file).replace(/^#include "([\w./-]+)"\s*$/gm, (_m, inc: string) =>
    read(posix.normalize(posix.join(dir, inc))).replace(/^#pragma once\s*$/m, ''),
  );
}

/** One `extern "C" __global__` kernel written out in a source: its name, parameter count, and where its signature ends. */
export interface KernelSignature {
  readonly name: string;
  readonly params: number;
  /** the index just past the signature's closing parenthesis (the body's `{` follows) */
  readonly end: number;
}

/**
 * Every `extern "C" __global__` kernel written out in a spliced source, in source order
 * (kernels made by macros with token pasting are not listed). An attribute macro may follow
 * the launch bounds (select.cu's COV_CLUSTER_DIMS).
 */
export function kernelSignatures(src: string): KernelSignature[] {
  const out: KernelSignature[] = [];
  const re = /extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(?:[A-Z][A-Z0-9_]*\s+)?(\w+)\s*\(([^)]*)\)/g;
  for (const m of src.matchAll(re)) {
    // a macro's `__launch_bounds__(...) \` line break: not a kernel name
    if (m[1].startsWith('__')) continue;
    const params = m[2].trim();
    out.push({ name: m[1], params: params === '' ? 0 : params.split(',').length, end: m.index + m[0].length });
  }
  return out;
}

/**
 * The parameter count of each kernel written out in a spliced source (kernelSignatures): the
 * backend checks every launch against it, so a host argument list that drifted from its
 * kernel is a typed error on the first launch (CPU tests included, through the stand-in
 * driver) instead of a kernel reading misplaced arguments.
 */
export function kernelParamCounts(src: string): Map<string, number> {
  return new Map(kernelSignatures(src).map((k) => [k.name, k.params]));
}

export interface CompileResult {
  readonly cubin: Uint8Array;
  readonly cached: boolean;
  readonly ms: number;
}

/**
 * Compile (or load from the cache) one source for sm_<arch>. `arch` is the compute
 * capability as a number (90) or a string with a feature suffix ('90a': Hopper-only
 * instructions such as wgmma, which a plain sm_90 build rejects).
 */
export function compileCubin(
  libs: CudaLibs,
  source: string,
  name: string,
  arch: number | string,
  cacheDir: string | null,
  extraOptions: readonly string[] = [],
  /** compile even when the cache has this cubin (the cached one was refused), and replace it */
  refresh = false,
): CompileResult {
  const t0 = performance.now();
  const options = [`--gpu-architecture=sm_${arch}`, '--std=c++17', '-default-device', '--use_fast_math', ...extraOptions];
  const ver: [number, number] = [0, 0];
  {
    const ma = [0];
    const mi = [0];
    libs.nvrtc.nvrtcVersion(ma, mi);
    ver[0] = ma[0];
    ver[1] = mi[0];
  }
  const key = createHash('sha256')
    .update(source)
    .update('\0')
    .update(options.join(' '))
    .update(`\0nvrtc ${ver[0]}.${ver[1]}`)
    .digest('hex')
    .slice(0, 32);
  const file = cacheDir ? join(cacheDir, `${name}-sm${arch}-${key}.cubin`) : null;
  if (file && !refresh) {
    try {
      const buf = readFileSync(file);
      return { cubin: new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength), cached: true, ms: performance.now() - t0 };
    } catch {
      // not cached yet
    }
  }
  const nv = libs.nvrtc;
  const prog: unknown[] = [null];
  let r = nv.nvrtcCreateProgram(prog, source, `${name}.cu`, 0, null, null);
  if (r !== 0) throw nvrtcError(libs, r, `nvrtcCreateProgram(${name})`);
  try {
    r = nv.nvrtcCompileProgram(prog[0], options.length, options);
    if (r !== 0) {
      const size = [0];
      nv.nvrtcGetProgramLogSize(prog[0], size);
      const log = new Uint8Array(Math.max(1, Number(size[0])));
      nv.nvrtcGetProgramLog(prog[0], log);
      const text = new TextDecoder().decode(log).replace(/\0+$/, '');
      throw new CrispError('BACKEND_ERROR', `NVRTC could not compile ${name}.cu for sm_${arch}: ${text.slice(0, 4000)}`, {
        log: text,
      });
    }
    const size = [0];
    r = nv.nvrtcGetCUBINSize(prog[0], size);
    if (r !== 0) throw nvrtcError(libs, r, 'nvrtcGetCUBINSize');
    const cubin = new Uint8Array(Number(size[0]));
    r = nv.nvrtcGetCUBIN(prog[0], cubin);
    if (r !== 0) throw nvrtcError(libs, r, 'nvrtcGetCUBIN');
    if (file && cacheDir) {
      try {
        mkdirSync(cacheDir, { recursive: true });
        const tmp = `${file}.${process.pid}.tmp`;
        writeFileSync(tmp, cubin);
        renameSync(tmp, file);
      } catch {
        // a read-only cache is not an error: compile again next time
      }
    }
    return { cubin, cached: false, ms: performance.now() - t0 };
  } finally {
    nv.nvrtcDestroyProgram(prog);
  }
}

function nvrtcError(libs: CudaLibs, r: number, what: string): CrispError {
  let name = `nvrtcResult ${r}`;
  try {
    name = libs.nvrtc.nvrtcGetErrorString(r) ?? name;
  } catch {
    // keep the number
  }
  return new CrispError('BACKEND_ERROR', `${what} failed: ${name}`, { nvrtcError: name, code: r });
}
