/**
 * The hostile-input soak's own tests, without a GPU: on the CUDA backend over the stand-in
 * driver (every call's typed outcome, the fault cases, the pool and the stand-in's memory back
 * at the baseline, the sticky case), and on the float64 reference backend (every valid call's
 * rows checked for real, so the checking itself is tested against an independent
 * implementation, and every invalid call's code confirmed by the oracle). A check that cannot
 * fail is no check: the stand-in's outputs, all zeros, must be flagged.
 */
import { mulberry32, toFloat32 } from '@crisp/core';
import { CudaBackend, CudaFaults } from '@crisp/kernels-cuda';
import { attentionRows, createReferenceBackend } from '@crisp/reference';
import { describe, expect, it } from 'vitest';
import { standInDriver } from '../../../../packages/kernels-cuda/src/stand-in-driver.js';
import { explicitFaultCases, stickyCase } from './fault-cases.js';
import { randomMask } from './soak-calls.js';
import { type ProblemSpec, randomHost, referenceRow } from './soak-check.js';
import { runSoak } from './soak.js';

// one head count for every problem: the stand-in fills a device plan's reads for that many
const STAND_IN: readonly ProblemSpec[] = [
  { n: 2048, H: 4, Hkv: 2, d: 64, dtype: 'bf16' },
  { n: 1300, H: 4, Hkv: 4, d: 128, dtype: 'f16' },
];

function standInTarget() {
  const s = standInDriver({ heads: 4 });
  const faults = new CudaFaults();
  const backend = new CudaBackend(s.libs, { cacheDir: null, faults });
  return { s, faults, backend, foreign: createReferenceBackend() };
}

const SEEN_CODES = ['OUT_OF_MEMORY', 'BACKEND_ERROR', 'INVALID_MASK', 'DTYPE_MISMATCH', 'SHAPE_MISMATCH', 'DISPOSED', 'WRONG_BACKEND', 'INVALID_ARGUMENT', 'UNSUPPORTED', 'LIMIT_EXCEEDED'];

describe('the soak on the CUDA backend over the stand-in driver', () => {
  it('every call ends as expected, the fault cases recover, the memory comes back, the summary is JSON', async () => {
    const t = standInTarget();
    const summary = await runSoak(
      { backend: t.backend, faults: t.faults, foreign: t.foreign },
      { calls: 300, seed: 5, problems: STAND_IN, verify: false, computes: false },
      explicitFaultCases,
    );
    expect(summary.failures).toEqual([]);
    expect(summary.lost).toBe(0);
    expect(summary.unexpected).toBe(0);
    expect(summary.memory.leak).toBe(false);
    expect(summary.memory.liveDeltaBytes).toBe(0);
    expect(summary.memory.freeDropBytes).toBe(0);
    expect(summary.faultCases.map((c) => [c.name, c.got, c.after, c.passed])).toEqual(summary.faultCases.map((c) => [c.name, c.expected[0], 'ok', true]));
    expect(summary.faultCases.length).toBe(13);
    expect(summary.passed).toBe(true);
    expect(summary.completed).toBe(300 + summary.warmUpCalls);
    // every valid kind but FlexPrefill's and the released plan's (see buildHelpers), on each problem
    expect(summary.warmUpCalls).toBe(2 * 11);
    expect(Object.keys(summary.byFamily).sort()).toEqual(['fault', 'invalid', 'policy', 'valid']);
    for (const code of SEEN_CODES) expect(summary.byCode[code], code).toBeGreaterThan(0);
    expect(JSON.parse(JSON.stringify(summary))).toEqual(summary);
    // what the backend took from the stand-in is back once disposed: no block left, none freed twice
    t.backend.dispose();
    expect(t.s.memory).toMatchObject({ bytes: 0, blocks: 0, badFrees: 0 });
  });

  it("flags outputs that are wrong (the stand-in's are zeros) and masks that leave a row empty (its device plans read back no blocks) as lost results", async () => {
    const t = standInTarget();
    const summary = await runSoak({ backend: t.backend }, { calls: 0, problems: STAND_IN.slice(0, 1), computes: false });
    expect(summary.warmUpCalls).toBe(11);
    expect(summary.byFamily.valid.mismatched, JSON.stringify(summary.byKind)).toBe(11);
    expect(summary.lost).toBe(11);
    expect(summary.passed).toBe(false);
    t.backend.dispose();
  });

  it('the sticky case: DEVICE_LOST, refused, disposed, recreated', async () => {
    const s = standInDriver({ heads: 4 });
    const res = await stickyCase(async (faults) => new CudaBackend(s.libs, { cacheDir: null, faults }), 'code', false);
    expect(res).toEqual({
      mode: 'code',
      fault: 'DEVICE_LOST',
      refusedAfter: ['DEVICE_LOST', 'DEVICE_LOST', 'DEVICE_LOST', 'DEVICE_LOST'],
      secondBackend: 'DEVICE_LOST',
      disposed: 'ok',
      recreated: 'ok',
      afterRecreate: 'ok',
      recovered: true,
      passed: true,
    });
    expect(s.memory).toMatchObject({ bytes: 0, badFrees: 0 });
  });
});

describe('the soak on the float64 reference backend', () => {
  it("checks every valid call's rows for real and agrees with the oracle on every invalid call's code", async () => {
    const backend = createReferenceBackend();
    const summary = await runSoak(
      { backend, foreign: createReferenceBackend() },
      {
        calls: 60,
        seed: 11,
        problems: [
          { n: 640, H: 2, Hkv: 1, d: 32, dtype: 'bf16' },
          { n: 384, H: 2, Hkv: 2, d: 16, dtype: 'f16' },
        ],
        strictPolicy: false,
      },
    );
    expect(summary.failures).toEqual([]);
    expect(summary.passed).toBe(true);
    expect(summary.checkedRows).toBeGreaterThan(100);
    // the reference's outputs are the float64 result rounded once: far inside the tolerance
    expect(summary.worstRowError.bf16).toBeLessThan(5e-3);
    expect(summary.worstRowError.f16).toBeLessThan(1e-3);
    backend.dispose();
  });

  it("computes a row as @crisp/reference's attentionRows does, dense and under a mask, chunked too", () => {
    const r = mulberry32(3);
    const [n, m, H, Hkv, d, B] = [300, 200, 4, 2, 16, 32];
    const q = randomHost(r, 'f16', [m, H, d], 2);
    const k = randomHost(r, 'f16', [n, Hkv, d], 2);
    const v = randomHost(r, 'f16', [n, Hkv, d], 1);
    const rows = [0, 57, 199];
    const hv = { q: toFloat32(q), k: toFloat32(k), v: toFloat32(v) };
    for (const mask of [undefined, randomMask(r, H, Math.ceil(n / B), B)]) {
      const want = attentionRows(q, k, v, rows, mask).output;
      for (let i = 0; i < rows.length; i++) {
        for (let h = 0; h < H; h++) {
          const got = referenceRow(hv, { m, n, H, Hkv, d }, rows[i], h, 1 / Math.sqrt(d), mask);
          const w = want.subarray((i * H + h) * d, (i * H + h + 1) * d);
          for (let c = 0; c < d; c++) expect(Math.abs(got[c] - w[c]), `row ${rows[i]} head ${h}`).toBeLessThan(1e-12);
        }
      }
    }
  });
});
