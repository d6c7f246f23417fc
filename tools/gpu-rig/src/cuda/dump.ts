/**
 * Phase dump: one layer of the llama fill at --dumpN tokens written as a safetensors dump
 * (q, k, v in the canonical [n, H, d] layout) straight from the device through @crisp/io's
 * streamed writer, for `crisp run --qkv` to read back (h200.sh million).
 */
import { statSync } from 'node:fs';
import { deviceTensorSource, writeSafetensors } from '@crisp/io';
import { arg } from './args.js';
import { be } from './backend.js';
import { log, step } from './harness.js';
import { D, H, Hkv } from './shapes.js';

export async function dumpPhase(): Promise<void> {
  const n = Number(arg('dumpN', '1048576'));
  const path = arg('dumpPath', '/tmp/crisp-dump.safetensors');
  await step(`dump_${n}`, async () => {
    const q = be.allocate('bf16', [n, H, D]);
    const k = be.allocate('bf16', [n, Hkv, D]);
    const v = be.allocate('bf16', [n, Hkv, D]);
    try {
      be.fillLlamaLike(q, k, v, 7);
      await be.synchronize();
      const t0 = performance.now();
      await writeSafetensors(path, { q: deviceTensorSource(be, q), k: deviceTensorSource(be, k), v: deviceTensorSource(be, v) });
      const ms = performance.now() - t0;
      const bytes = statSync(path).size;
      log(`dump n=${n}: ${path} ${(bytes / 2 ** 30).toFixed(2)} GiB written in ${(ms / 1000).toFixed(1)} s`);
      return { n, path, bytes, writeMs: ms };
    } finally {
      for (const t of [q, k, v]) t.dispose();
    }
  });
}
