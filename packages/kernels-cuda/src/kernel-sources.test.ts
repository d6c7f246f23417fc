import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CrispError } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { defaultKernelDir, kernelSource } from './runtime/compile.js';
import { KERNEL_SOURCES } from './kernel-sources.generated.js';

const dir = defaultKernelDir();
const files = readdirSync(dir, { recursive: true })
  .map((f) => String(f).split('\\').join('/'))
  .filter((f) => /\.(cu|cuh)$/.test(f))
  .sort();

describe('embedded kernel sources', () => {
  it('are kernels/ exactly (after editing a kernel: pnpm -F @crisp/kernels-cuda embed-kernels)', () => {
    expect(Object.keys(KERNEL_SOURCES).sort()).toEqual(files);
    for (const f of files) expect(KERNEL_SOURCES[f], f).toBe(readFileSync(join(dir, f), 'utf8'));
  });

  it('splice to the same source as the folder, includes and all (so the cubin cache keys match)', () => {
    for (const f of files.filter((x) => x.endsWith('.cu'))) {
      const embedded = kernelSource(undefined, f);
      expect(embedded, f).toBe(kernelSource(dir, f));
      expect(embedded, f).not.toMatch(/^#include "/m);
    }
  });

  it('name a missing kernel in a typed error, from the build or from a folder', () => {
    const err = (fn: () => unknown) => {
      try {
        fn();
      } catch (e) {
        return e;
      }
      throw new Error('no error');
    };
    const a = err(() => kernelSource(undefined, 'nope.cu'));
    expect(a).toBeInstanceOf(CrispError);
    expect((a as CrispError).code).toBe('BACKEND_UNAVAILABLE');
    expect((a as Error).message).toMatch(/nope\.cu is not among the embedded kernels \(attention\/attention-wgmma\.cu, /);
    const b = err(() => kernelSource('/nonexistent-crisp-kernels', 'mask/mask.cu'));
    expect(b).toBeInstanceOf(CrispError);
    expect((b as CrispError).code).toBe('BACKEND_UNAVAILABLE');
    expect((b as Error).message).toMatch(/mask\/mask\.cu not found in \/nonexistent-crisp-kernels .*leave it unset to compile the embedded ones/);
  });
});
