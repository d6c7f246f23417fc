// The files apps/bench/peers/dump_qkv.py writes (its numpy-only writer, no torch needed) are
// what `crisp run --qkv DIR` reads: shapes, dtypes, bits, and the crisp.layers metadata that
// lets a dump of chosen layers (--layers 0,3) through the gap check.
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bf16BitsToF32 } from '@crisp/core';
import { openTensorFile, readTensor } from '@crisp/io';
import { describe, expect, it } from 'vitest';
import type { ModelSummary } from './model-run.js';
import { runCli, tempDir } from './test-support.js';

const PEERS = fileURLToPath(new URL('../../bench/peers', import.meta.url));
const env = { ...process.env, PYTHONPYCACHEPREFIX: mkdtempSync(join(tmpdir(), 'crisp-pycache-')) };
const numpy = spawnSync('python3', ['-c', 'import numpy'], { encoding: 'utf8', env });
const why = numpy.error ? 'python3 is not installed' : numpy.status !== 0 ? 'numpy is not importable' : '';
if (why) console.log(`[dump format] skipping: ${why}`);

const WRITE = `
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import dump_qkv
out = sys.argv[2]
rng = np.random.default_rng(7)
first = {}
for layer in (0, 3):
    t = {}
    for role, heads in (("q", 4), ("k", 2), ("v", 2)):
        x = rng.standard_normal((1280, heads, 32)).astype(np.float32)
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
        t[role] = ("bfloat16", bits)
        if layer == 0: first[role] = [int(b) for b in bits.reshape(-1)[:5]]
    dump_qkv.write_safetensors(dump_qkv.layer_file(out, layer, 3), t, {"crisp.layer": layer, "crisp.layers": "0,3", "crisp.layout": "nhd", "crisp.model": "numpy"})
print(json.dumps(first))
`;

describe.skipIf(Boolean(why))("dump_qkv.py's files through crisp run --qkv DIR", () => {
  it('reads them bit for bit and runs both layers', async () => {
    const dir = tempDir('crisp-dump-format-');
    const w = spawnSync('python3', ['-c', WRITE, PEERS, dir], { encoding: 'utf8', env });
    expect(w.status, w.stderr).toBe(0);
    const first: Record<'q' | 'k' | 'v', number[]> = JSON.parse(w.stdout);
    await using f = await openTensorFile(join(dir, 'layer_00.safetensors'));
    expect(f.metadata).toMatchObject({ 'crisp.layer': '0', 'crisp.layers': '0,3', 'crisp.layout': 'nhd' });
    for (const role of ['q', 'k', 'v'] as const) {
      const t = await readTensor(f, role, { layout: 'nhd' });
      expect(t.dtype).toBe('bf16');
      expect(t.shape).toEqual([1280, role === 'q' ? 4 : 2, 32]);
      expect(Array.from(t.data.subarray(0, 5))).toEqual(first[role]);
      expect(Number.isFinite(bf16BitsToF32(t.data[0]))).toBe(true);
    }
    const r = await runCli(['run', '--qkv', dir, '--backend', 'reference', '--sample-rows', '4', '--no-gate', '--no-dense', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const m: ModelSummary = JSON.parse(r.stdout);
    expect(m.lines.map((l) => [l.layer, l.n])).toEqual([
      [0, 1280],
      [3, 1280],
    ]);
  });
});
