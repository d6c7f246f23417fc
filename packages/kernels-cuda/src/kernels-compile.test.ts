/**
 * The shipped kernel sources: their layout, the spliced headers, programmatic launches and
 * parameter counts. The nvcc compile check of the same files is nvcc-compile.test.ts, run
 * as its own task (`test:heavy`), beside the other suites at a low CPU priority.
 */
import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { defaultKernelDir, kernelSignatures, kernelSource } from './runtime/compile.js';
import { PDL_KERNELS } from './index.js';

const kernelDir = defaultKernelDir();
const files = readdirSync(kernelDir, { recursive: true })
  .map((f) => String(f).split('\\').join('/'))
  .filter((f) => f.endsWith('.cu'));

describe('kernel sources', () => {
  it('ships the ten kernel files, in folders by role', () => {
    expect(files.sort()).toEqual([
      'attention/attention-wgmma.cu',
      'attention/attention.cu',
      'fill/fill.cu',
      'mask/mask.cu',
      'pe/pe.cu',
      'proxy/proxy-reduce.cu',
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
  for (const k of kernelSignatures(sources)) {
    const open = sources.indexOf('{', k.end);
    entries.set(k.name, sources.slice(open + 1, open + 400));
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

describe('kernel parameter counts (checked at every launch)', () => {
  it('reads each written-out kernel signature, skipping macro lines', async () => {
    const { kernelParamCounts } = await import('./runtime/compile.js');
    const c = kernelParamCounts(kernelSource(kernelDir, 'proxy/proxy-reduce.cu'));
    expect(c.get('proxy_cstruct')).toBe(9);
    expect(c.get('proxy_combine')).toBe(10);
    expect(c.get('proxy_fused_sums')).toBe(10);
    expect(c.get('count_nonfinite_f64')).toBe(3);
    expect([...c.keys()].some((k) => k.startsWith('__'))).toBe(false);
    expect(kernelParamCounts('extern "C" __global__ void __launch_bounds__(256) k(int a, float* b) {}').get('k')).toBe(2);
    expect(kernelParamCounts('extern "C" __global__ void none() {}').get('none')).toBe(0);
    // an attribute macro after the launch bounds (the cluster form of the coverage selection)
    const sel = kernelParamCounts(kernelSource(kernelDir, 'select/select.cu'));
    expect(sel.get('coverage_select')).toBe(15);
    expect(sel.get('coverage_select_c8')).toBe(15);
    expect(kernelParamCounts('extern "C" __global__ void __launch_bounds__(64) DIMS\n    k(int a) {}').get('k')).toBe(1);
  });
});
