/**
 * Compile-checks every shipped .cu with nvcc for sm_80 and sm_90 (what NVRTC will do at
 * first use on those GPUs), and asserts ptxas reports no register spills. Runs wherever
 * nvcc is installed (CPU machines included); skips with a printed reason elsewhere.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { defaultKernelDir, kernelSource } from './runtime/compile.js';
import { PDL_KERNELS } from './index.js';

const run = promisify(execFile);
const NVCC = [process.env.NVCC, '/usr/local/bin/nvcc', '/usr/local/cuda/bin/nvcc'].find((p) => p && existsSync(p));
const kernelDir = defaultKernelDir();
const files = readdirSync(kernelDir, { recursive: true })
  .map((f) => String(f).split('\\').join('/'))
  .filter((f) => f.endsWith('.cu'));

if (!NVCC) console.log('kernels-cuda: nvcc compile checks skipped: no nvcc at /usr/local/bin or /usr/local/cuda/bin (set NVCC)');

describe('kernel sources', () => {
  it('ships the nine kernel files, in folders by role', () => {
    expect(files.sort()).toEqual([
      'attention/attention-wgmma.cu',
      'attention/attention.cu',
      'fill/fill.cu',
      'mask/mask.cu',
      'pe/pe.cu',
      'proxy/proxy-wgmma.cu',
      'proxy/proxy.cu',
      'route/route.cu',
      'select/select.cu',
    ]);
  });
  it('splices the common header in, so NVRTC needs no include path', () => {
    const src = kernelSource(kernelDir, 'attention/attention.cu');
    expect(src).not.toMatch(/^#include/m);
    expect(src).not.toMatch(/^#pragma once/m);
    expect(src).toContain('__device__ __forceinline__ void ldsm_x4');
    expect(src).toContain('attn_w32_bf16_d128_b128');
  });
  it('splices every header a kernel file includes (the wgmma proxy pass takes three)', () => {
    for (const f of files) {
      const src = kernelSource(kernelDir, f);
      expect(src, f).not.toMatch(/^#include/m);
      expect(src, f).not.toMatch(/^#pragma once/m);
    }
    const src = kernelSource(kernelDir, 'proxy/proxy-wgmma.cu');
    expect(src).toContain('__device__ __forceinline__ void cp_async16');
    expect(src).toContain('__device__ __forceinline__ u64 gmma_desc');
    expect(src).toContain('__device__ __forceinline__ void p2b_rows');
  });
});

describe('programmatic launches', () => {
  // A kernel launched with programmatic serialisation may run beside the kernel before it:
  // it must wait (CRISP_PDL_ENTRY) before touching memory. Every such kernel begins with the
  // wait, and every kernel that waits is launched so (else the wait is dead code).
  const sources = files.map((f) => kernelSource(kernelDir, f)).join('\n');
  const entries = new Map<string, string>();
  for (const m of sources.matchAll(/extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\s*\(/g)) {
    const open = sources.indexOf('{', m.index + m[0].length);
    entries.set(m[1], sources.slice(open + 1, open + 400));
  }
  it('every kernel in PDL_KERNELS starts with CRISP_PDL_ENTRY, and no other kernel has it', () => {
    for (const name of PDL_KERNELS) {
      expect(entries.has(name), name).toBe(true);
      expect(entries.get(name)?.trimStart().startsWith('CRISP_PDL_ENTRY();'), name).toBe(true);
    }
    const waiting = [...entries].filter(([, body]) => body.includes('CRISP_PDL_ENTRY')).map(([name]) => name);
    expect(new Set(waiting)).toEqual(PDL_KERNELS);
  });
});

describe.skipIf(!NVCC)('nvcc compile check', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'crisp-nvcc-'));
  afterAll(() => rmSync(tmp, { recursive: true, force: true }));
  // sm_90: full cubin through ptxas, so register spills show; sm_80: PTX (the front end,
  // fast) — the same code, and ptxas for sm_80 is what the driver runs at load. The
  // wgmma file is also built for sm_90a, the only target where its kernels have bodies
  // (elsewhere they are trap stubs, which the sm_80/sm_90 builds check still compile).
  const hopperOnly = ['attention/attention-wgmma.cu', 'proxy/proxy-wgmma.cu'];
  it('every kernel compiles for sm_90 (cubin) without spills and for sm_80 (PTX)', async () => {
    const hopperJobs = hopperOnly.map((f) =>
      run(
        NVCC as string,
        ['-cubin', '-arch=sm_90a', '-std=c++17', '--use_fast_math', '-Xptxas', '-v', '-o', join(tmp, `${f.replace('/', '_')}.a.cubin`), f],
        { cwd: kernelDir, maxBuffer: 1 << 24 },
      ).then(({ stderr }) => ({ f, arch: 'sm_90a', stderr })),
    );
    const jobs = files.flatMap((f) => [
      run(
        NVCC as string,
        ['-cubin', '-arch=sm_90', '-std=c++17', '--use_fast_math', '-Xptxas', '-v', '-o', join(tmp, `${f.replace('/', '_')}.cubin`), f],
        { cwd: kernelDir, maxBuffer: 1 << 24 },
      ).then(({ stderr }) => ({ f, arch: 'sm_90', stderr })),
      run(NVCC as string, ['--ptx', '-arch=sm_80', '-std=c++17', '--use_fast_math', '-o', join(tmp, `${f.replace('/', '_')}.ptx`), f], {
        cwd: kernelDir,
        maxBuffer: 1 << 24,
      }).then(({ stderr }) => ({ f, arch: 'sm_80', stderr })),
    ]);
    const reports = await Promise.all([...jobs, ...hopperJobs]);
    expect(reports.filter((r) => r.arch === 'sm_90a').length).toBe(hopperOnly.length);
    for (const { f, arch, stderr } of reports) {
      expect(stderr, `${f} ${arch}`).not.toMatch(/error|warning/i);
      // ptxas says so when it has to serialise wgmma (a silent 2x slowdown)
      expect(stderr, `${f} ${arch}`).not.toMatch(/Potential Performance Loss/i);
      if (arch === 'sm_80') continue;
      if (arch === 'sm_90a') {
        // real bodies there (the stubs of the other targets use a handful of registers)
        const regs = [...stderr.matchAll(/Used (\d+) registers/g)].map((m) => Number(m[1]));
        expect(regs.length, f).toBeGreaterThan(0);
        for (const r of regs) expect(r, `${f}: an sm_90a kernel compiled to a stub`).toBeGreaterThanOrEqual(64);
      }
      const entries = [...stderr.matchAll(/Compiling entry function '(\w+)'/g)].map((m) => m[1]);
      expect(entries.length, `${f}: ptxas compiled no entry function`).toBeGreaterThan(0);
      const spills = [...stderr.matchAll(/(\d+) bytes spill stores, (\d+) bytes spill loads/g)].map((m) => Number(m[1]) + Number(m[2]));
      expect(spills.length, f).toBe(entries.length);
      entries.forEach((name, i) => {
        // The w32 layout with 64-key tiles hold 128 output + 64 score accumulators a
        // thread under a 255-register cap: ptxas spills 40 bytes there (measured against
        // the spill-free layouts on the H200). The wgmma fused proxy pass at d 128, B 128 (256
        // threads, two CTAs an SM: a 128-register cap) spills 8 bytes with its lean tile loop.
        // Everything else must not spill.
        const allowed =
          /^attn_w32_/.test(name) && name.includes('_d128_') ? 2 * 64 : /^proxy_wg_pass1f_\w+_d128_b128$/.test(name) ? 2 * 8 : 0;
        expect(spills[i], `${f}: ${name} spills registers`).toBeLessThanOrEqual(allowed);
      });
    }
  }, 400_000);
});

describe('kernel parameter counts (checked at every launch)', () => {
  it('reads each written-out kernel signature, skipping macro lines', async () => {
    const { kernelParamCounts } = await import('./runtime/compile.js');
    const c = kernelParamCounts(kernelSource(kernelDir, 'proxy/proxy.cu'));
    expect(c.get('proxy_cstruct')).toBe(9);
    expect(c.get('proxy_combine')).toBe(10);
    expect(c.get('proxy_fused_sums')).toBe(10);
    expect(c.get('count_nonfinite_f64')).toBe(3);
    expect([...c.keys()].some((k) => k.startsWith('__'))).toBe(false);
    expect(kernelParamCounts('extern "C" __global__ void __launch_bounds__(256) k(int a, float* b) {}').get('k')).toBe(2);
    expect(kernelParamCounts('extern "C" __global__ void none() {}').get('none')).toBe(0);
  });
});
