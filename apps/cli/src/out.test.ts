// crisp run --out FILE: the preset's output (and LSE and plan) as safetensors, the same bits
// the library computes, written whole or not at all.
import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type PrefillPlan, planPrefill, runPlan } from '@crisp/core';
import { type TensorFile, openTensorFile } from '@crisp/io';
import { crisp } from '@crisp/presets';
import { createReferenceBackend } from '@crisp/reference';
import { scenario, uploadScenario } from '@crisp/synth';
import { beforeAll, describe, expect, it } from 'vitest';
import type { RunSummary } from './run-job.js';
import { runCli, tempDir, testSeed } from './test-support.js';

const SEED = testSeed();
const SHAPE = ['--n', '1536', '--heads', '4', '--kv-heads', '1', '--head-dim', '32'];
const SMALL = ['--backend', 'reference', ...SHAPE, '--seed', String(SEED), '--sample-rows', '8', '--no-gate'];

async function raw(f: TensorFile, name: string): Promise<Uint8Array> {
  const info = f.tensor(name);
  const b = new Uint8Array(info.byteLength);
  await f.read(b, info.byteOffset);
  return b;
}
const i32 = (b: Uint8Array) => Array.from(new Int32Array(b.buffer, b.byteOffset, b.byteLength / 4));
const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

describe('crisp run --out', () => {
  const dir = tempDir('crisp-out-');
  const path = join(dir, 'out.safetensors');
  let summary: RunSummary;
  let plan: PrefillPlan;
  let want: { output: Uint8Array; lse: Uint8Array };
  beforeAll(async () => {
    const r = await runCli(['run', ...SMALL, '--out', path, '--out-lse', '--out-plan', '--json']);
    expect(r.code, r.stderr).toBe(0);
    summary = JSON.parse(r.stdout);
    const sc = scenario('llama-like', { n: 1536, heads: 4, kvHeads: 1, headDim: 32, seed: SEED });
    const be = createReferenceBackend();
    const t = await uploadScenario(be, sc);
    plan = await planPrefill(be, t, crisp, { minSparseLength: 0 });
    expect(plan.denseReason).toBeUndefined();
    const res = await runPlan(be, plan, t, { returnLse: true });
    want = { output: bytes((await be.download(res.output)).data), lse: bytes((await be.download(res.lse!)).data) };
    be.dispose();
  });

  it('writes output, lse and the plan: the bits the library computes, named as documented', async () => {
    expect(summary.out).toMatchObject({ path, bytes: statSync(path).size });
    await using f = await openTensorFile(path);
    expect(f.tensor('output')).toMatchObject({ fileDtype: 'F32', shape: [1536, 4, 32] });
    expect(f.tensor('lse')).toMatchObject({ fileDtype: 'F32', shape: [4, 1536] });
    expect(Buffer.from(await raw(f, 'output')).equals(Buffer.from(want.output))).toBe(true);
    expect(Buffer.from(await raw(f, 'lse')).equals(Buffer.from(want.lse))).toBe(true);
    expect(Array.from(new Int8Array((await raw(f, 'plan.routes')).buffer))).toEqual(plan.routing!.routes.map((r) => (r === 'pe' ? 1 : 0)));
    const vs = plan.mask!.vs!;
    expect(i32(await raw(f, 'plan.vertical_ptr'))).toEqual(Array.from(vs.verticalPtr));
    expect(i32(await raw(f, 'plan.vertical'))).toEqual(Array.from(vs.vertical));
    expect(i32(await raw(f, 'plan.slash_ptr'))).toEqual(Array.from(vs.slashPtr));
    expect(i32(await raw(f, 'plan.slash'))).toEqual(Array.from(vs.slash));
    if (plan.mask!.rows) {
      expect(i32(await raw(f, 'plan.rows.rowPtr'))).toEqual(Array.from(plan.mask!.rows.rowPtr));
      expect(i32(await raw(f, 'plan.rows.cols'))).toEqual(Array.from(plan.mask!.rows.cols));
    }
    expect(f.metadata).toMatchObject({ 'crisp.format': 'crisp-run-output/1', 'crisp.policy': 'crisp', 'crisp.blockSize': '128', 'crisp.routes': plan.routing!.routes.join(',') });
    expect(Number(f.metadata['crisp.density'])).toBeCloseTo(plan.overallDensity, 12);
  });

  it('without --out-lse and --out-plan writes the output alone; the text output names the file; an old file is replaced whole', async () => {
    const p2 = join(dir, 'only.safetensors');
    writeFileSync(p2, 'an old file');
    const r = await runCli(['run', ...SMALL, '--out', p2]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`wrote ${p2} \\(\\d+ bytes: output\\)`));
    await using f = await openTensorFile(p2);
    expect(f.tensors.map((t) => t.name)).toEqual(['output']);
    expect(Buffer.from(await raw(f, 'output')).equals(Buffer.from(want.output))).toBe(true);
    expect(readdirSync(dir).filter((x) => x.startsWith('.'))).toEqual([]);
  });

  it('refuses a bad --out before any work, and --out-lse / --out-plan without --out', async () => {
    const missing = await runCli(['run', ...SMALL, '--out', join(dir, 'no-such-dir', 'x.safetensors')]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/IO_ERROR: .*does not exist/);
    expect(missing.stderr).not.toMatch(/estimate|dense baseline/);
    const isDir = await runCli(['run', ...SMALL, '--out', dir]);
    expect(isDir.code).toBe(1);
    expect(isDir.stderr).toMatch(/it is a directory/);
    for (const flag of ['--out-lse', '--out-plan']) {
      const r = await runCli(['run', ...SMALL, flag]);
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(/pass --out FILE/);
    }
    expect(readFileSync(join(dir, 'only.safetensors')).length).toBeGreaterThan(1536 * 4 * 32 * 4);
  });
});
