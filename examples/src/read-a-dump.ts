/**
 * Example (d): reading a dump. Q/K/V of one layer are written as a safetensors file with
 * @crisp/io's writer (bf16, stored head-major [H, n, d] as many model dumps are), read back
 * with `readQkv` (which turns them into the canonical [n, H, d]), checked bit for bit against
 * what was written, and run through `sparsePrefill` with the `crisp` preset.
 *
 * Run: pnpm --filter @crisp/examples example read-a-dump
 */
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type HostTensor, hostTensor, sparsePrefill } from '@crisp/core';
import { readQkv, writeSafetensors } from '@crisp/io';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';

/** Seeded values in [-2, 2): the same tensors on every run. */
function seeded(len: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: len }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s / 2 ** 32) * 4 - 2;
  });
}

export interface DumpResult {
  /** what was written and what was read back, in the canonical [n, H, d] layout */
  readonly written: { readonly q: HostTensor; readonly k: HostTensor; readonly v: HostTensor };
  readonly read: { readonly q: HostTensor; readonly k: HostTensor; readonly v: HostTensor };
  readonly fileBytes: number;
  readonly heads: number;
  readonly routes: readonly ('vs' | 'pe')[];
  readonly density: number;
  readonly outputShape: readonly number[];
}

export async function main(log: (line: string) => void = console.log): Promise<DumpResult> {
  const [n, H, Hkv, d] = [2048, 4, 2, 32];
  const written = {
    q: hostTensor('bf16', [n, H, d], seeded(n * H * d, 1)),
    k: hostTensor('bf16', [n, Hkv, d], seeded(n * Hkv * d, 2)),
    v: hostTensor('bf16', [n, Hkv, d], seeded(n * Hkv * d, 3)),
  };
  const dir = await mkdtemp(join(tmpdir(), 'crisp-dump-'));
  const backend = createReferenceBackend();
  try {
    const path = join(dir, 'layer0.safetensors');
    await writeSafetensors(path, written, { layout: 'hnd' });
    const fileBytes = (await stat(path)).size;
    const read = await readQkv(path, { layout: 'hnd' });
    log(`${path}: ${fileBytes} bytes; read q [${read.q.shape}] k [${read.k.shape}] v [${read.v.shape}] (${read.q.dtype})`);

    const { output, plan } = await sparsePrefill(
      backend,
      { q: backend.upload(read.q), k: backend.upload(read.k), v: backend.upload(read.v) },
      crisp,
    );
    const out = await backend.download(output);
    const routes = plan.routing?.routes ?? [];
    log(`routes: ${routes.join(' ')}; density ${plan.overallDensity.toFixed(3)}; output [${out.shape}]`);
    return { written, read: { q: read.q, k: read.k, v: read.v }, fileBytes, heads: H, routes, density: plan.overallDensity, outputShape: out.shape };
  } finally {
    backend.dispose();
    await rm(dir, { recursive: true, force: true });
  }
}
