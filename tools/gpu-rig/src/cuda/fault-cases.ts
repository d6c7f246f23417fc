/**
 * The explicit fault cases, each followed by a valid call that must run and match: an
 * allocation failing part way through a plan (injected at each of its first allocations, and
 * for real, the device filled by a ballast), a launch the driver refuses part way through a
 * plan, NaN in the inputs, a custom policy whose selection holds NaN. And the sticky case,
 * on a backend of its own: a kernel given an unmapped address faults the context, every
 * later call is DEVICE_LOST, the backend disposes cleanly, and a new one works.
 */
import { type Backend, type DeviceTensor, isCrispError, mulberry32, sparsePrefill, toFloat32 } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { fixed } from '@crisp/router';
import { CUDA_ERROR, CudaFaults } from '@crisp/kernels-cuda';
import type { FaultCaseResult, Soak } from './soak.js';
import { ROW_TOLERANCE, outputRows, randomHost, referenceRow, rowError } from './soak-check.js';
import type { Call, CudaTools } from './soak-types.js';

async function codeOf(fn: () => unknown): Promise<string> {
  try {
    await fn();
    return 'ok';
  } catch (e) {
    return isCrispError(e) ? e.code : `untyped ${(e as Error)?.name}: ${(e as Error)?.message}`;
  }
}

/**
 * One case: `fault` (armed inside, disarmed after), its outcome against `expected`, the pool
 * back at its start once trimmed, then a valid call that must run and match.
 */
async function runCase(soak: Soak, name: string, expected: readonly string[], fault: () => Promise<unknown>, after: Call): Promise<FaultCaseResult> {
  const start = soak.snapshot();
  let got: string;
  try {
    const res = (await fault()) as { output?: DeviceTensor } | undefined;
    res?.output?.dispose();
    got = 'ok';
  } catch (e) {
    got = isCrispError(e) ? e.code : `untyped ${(e as Error)?.name}: ${(e as Error)?.message}`;
  } finally {
    soak.faults?.clear();
  }
  const mid = soak.snapshot();
  const memoryBack = start.liveBytes === undefined ? undefined : mid.liveBytes === start.liveBytes;
  let next: string;
  try {
    const v = (await after.run()) as NonNullable<Awaited<ReturnType<Call['run']>>>;
    try {
      next = (await soak.check(`${name} (the call after)`, v)) ? 'ok' : 'mismatch';
    } finally {
      v.release();
    }
  } catch (e) {
    next = isCrispError(e) ? e.code : `untyped ${String(e)}`;
  }
  const passed = expected.includes(got) && next === 'ok' && memoryBack !== false;
  soak.log(`fault case ${name}: ${got} (expected ${expected.join(' or ')}), then ${next}${memoryBack === false ? ', memory not back' : ''}`);
  return { name, expected, got, after: next, ...(memoryBack === undefined ? {} : { memoryBack }), passed };
}

/** The explicit cases on the soak's backend (those needing the injector or the pool's counters only on CUDA). */
export async function explicitFaultCases(soak: Soak): Promise<FaultCaseResult[]> {
  const out: FaultCaseResult[] = [];
  const problems = soak.h.problems;
  // the largest problem that takes crisp's sparse path
  const p = [...problems].sort((a, b) => b.n * b.H - a.n * a.H)[0];
  const inputs = { q: p.q, k: p.k, v: p.v };
  const plan = () => sparsePrefill(soak.be, inputs, crisp, { minSparseLength: 0 });
  const after = () => soak.h.valid(p, 'prefill:crisp');
  const { faults, tools } = soak;
  if (faults && tools) {
    for (let k = 1; k <= 6; k++) {
      out.push(
        await runCase(soak, `oom at allocation ${k} of a plan`, ['OUT_OF_MEMORY'], async () => {
          tools.trimMemory();
          faults.failAlloc({ at: k });
          return plan();
        }, after()),
      );
    }
    for (const j of [1, 4, 9, 16, 25]) {
      out.push(await runCase(soak, `launch ${j} of a plan refused by the driver`, ['BACKEND_ERROR'], async () => {
        faults.failLaunch({ at: j, mode: 'invalid' });
        return plan();
      }, after()));
    }
    out.push(await runCase(soak, 'a launch failing with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES', ['BACKEND_ERROR'], async () => {
      faults.failLaunch({ at: 3, code: 701 });
      return plan();
    }, after()));
  }
  if (tools) out.push(await ballastCase(soak, tools, plan, p.n * p.H * p.d * 2, after()));
  if (soak.opts.computes ?? true) {
    out.push(await runCase(soak, 'NaN in q', ['NON_FINITE'], async () => {
      const data = p.bits.q.slice();
      data[Math.floor(data.length / 3)] = p.dtype === 'bf16' ? 0x7fc0 : 0x7e00;
      const q = soak.be.upload({ dtype: p.dtype, shape: p.q.shape, data });
      try {
        return await sparsePrefill(soak.be, { q, k: p.k, v: p.v }, crisp, { minSparseLength: 0 });
      } finally {
        q.dispose();
      }
    }, after()));
  }
  if (soak.strictPolicy) {
    // every head routed to VS, so the selection is sure to be read (on random inputs crisp's router may send all heads to PE)
    const nanSelection = { ...crisp, name: 'nanSelection', router: fixed('vs'), vs: { name: 'nan', select: () => Float64Array.from([0, Number.NaN]) as unknown as Int32Array } };
    out.push(await runCase(soak, "NaN in a custom policy's selection", ['INVALID_MASK', 'INVALID_ARGUMENT'], () => sparsePrefill(soak.be, inputs, nanSelection, { minSparseLength: 0 }), after()));
  }
  return out;
}

/**
 * A real out-of-memory part way through a plan: the device filled by ballast tensors but
 * `leave` bytes (8 MiB, or half the plan's output where that is smaller: the output alone then
 * does not fit).
 */
async function ballastCase(soak: Soak, tools: CudaTools, plan: () => Promise<unknown>, outputBytes: number, after: Call): Promise<FaultCaseResult> {
  const leave = Math.min(8 * 2 ** 20, Math.floor(outputBytes / 2));
  const ballast: DeviceTensor[] = [];
  let left = Number.NaN;
  // (with a few MiB left a launch may be refused for want of resources instead: BACKEND_ERROR naming it)
  const r = await runCase(soak, `the device full but ${leave} bytes during a plan (ballast tensors)`, ['OUT_OF_MEMORY', 'BACKEND_ERROR'], async () => {
    try {
      // the pool rounds blocks over 1 MiB to 2 MiB and smaller ones to 256 bytes: large pieces, then small
      for (let i = 0; i < 8; i++) {
        const gap = tools.memoryInfo().free - leave;
        const bytes = gap > 2 ** 21 ? Math.floor(gap / 2 ** 21) * 2 ** 21 : Math.floor(Math.min(gap, 2 ** 20) / 256) * 256;
        if (bytes < 256) break;
        try {
          ballast.push(soak.be.allocate('bf16', [bytes / 2]));
        } catch {
          // (the driver keeps some of what it reports free: the plan then runs with what is left, named below)
          break;
        }
      }
      left = tools.memoryInfo().free;
      return await plan();
    } finally {
      for (const t of ballast) t.dispose();
    }
  }, after);
  return { ...r, name: `${r.name}, ${left} bytes left` };
}

/** What a backend of the sticky case offers: core's Backend, the CUDA tools, dispose. */
export type StickyBackend = Backend & CudaTools & { dispose(): void };

export interface StickyResult {
  readonly mode: 'code' | 'corrupt';
  /** the code of the faulting call (or of the read right after it) */
  readonly fault: string;
  /** later calls on the faulted backend: dense, allocate, download, synchronize */
  readonly refusedAfter: readonly string[];
  /** creating a second backend while the first still holds the faulted context */
  readonly secondBackend: string;
  readonly disposed: string;
  /** a new backend once every holder let go, and a dense call on it (checked) */
  readonly recreated: string;
  readonly afterRecreate: string;
  /** a new backend worked once every holder let go (the driver gave a fresh context) */
  readonly recovered: boolean;
  /** DEVICE_LOST from the fault on, refused after, a clean dispose (recovery is `recovered`: up to the driver) */
  readonly passed: boolean;
}

/**
 * The sticky fault: `make` creates a backend over the given injector (the same one each time). `mode` 'corrupt' (a GPU)
 * gives the dense kernel an unmapped address so the device faults; 'code' emulates it (the
 * stand-in). `verify` checks the dense outputs against float64 rows (a GPU).
 */
export async function stickyCase(make: (faults: CudaFaults) => Promise<StickyBackend>, mode: 'code' | 'corrupt', verify: boolean): Promise<StickyResult> {
  const r = mulberry32(7);
  const [n, H, Hkv, d] = [2048, 4, 2, 128];
  const host = { q: randomHost(r, 'bf16', [n, H, d], 2), k: randomHost(r, 'bf16', [n, Hkv, d], 2), v: randomHost(r, 'bf16', [n, Hkv, d], 1) };
  const f32 = { q: toFloat32(host.q), k: toFloat32(host.k), v: toFloat32(host.v) };
  const denseOk = async (be: StickyBackend): Promise<string> => {
    const q = be.upload(host.q);
    const k = be.upload(host.k);
    const v = be.upload(host.v);
    const res = await be.denseAttention(q, k, v);
    await be.synchronize();
    try {
      if (!verify) return 'ok';
      const rows = [0, 777, n - 1];
      const got = await outputRows(be, res.output, rows);
      for (let i = 0; i < rows.length; i++) {
        for (let h = 0; h < H; h++) {
          const err = rowError(got[i].subarray(h * d, (h + 1) * d), referenceRow(f32, { m: n, n, H, Hkv, d }, rows[i], h, 1 / Math.sqrt(d)));
          if (!(err <= ROW_TOLERANCE.bf16)) return `mismatch (row ${rows[i]} head ${h}: ${err})`;
        }
      }
      return 'ok';
    } finally {
      for (const t of [q, k, v, res.output]) t.dispose();
    }
  };
  const faults = new CudaFaults();
  const be = await make(faults);
  const warm = await codeOf(() => denseOk(be).then((x) => (x === 'ok' ? x : Promise.reject(new Error(x)))));
  const q = be.upload(host.q);
  const k = be.upload(host.k);
  faults.fault({ kernel: /^attn_/, mode, code: CUDA_ERROR.ILLEGAL_ADDRESS });
  const fault = await codeOf(async () => {
    const res = await be.denseAttention(q, k, k);
    await be.synchronize();
    be.readRows(res.output, Int32Array.of(0));
  });
  const refusedAfter = [
    await codeOf(() => be.denseAttention(q, k, k)),
    await codeOf(() => be.allocate('bf16', [16])),
    await codeOf(() => be.download(q)),
    await codeOf(() => be.synchronize()),
  ];
  // (one injector for every backend here: on a stand-in driver it is where the faulted context lives)
  const secondBackend = await codeOf(async () => (await make(faults)).dispose());
  const disposed = await codeOf(() => be.dispose());
  let afterRecreate = 'not reached';
  const recreated = await codeOf(async () => {
    const again = await make(faults);
    try {
      afterRecreate = await codeOf(async () => {
        const x = await denseOk(again);
        if (x !== 'ok') throw new Error(x);
      });
    } finally {
      again.dispose();
    }
  });
  const passed =
    warm === 'ok' &&
    fault === 'DEVICE_LOST' &&
    refusedAfter.every((c) => c === 'DEVICE_LOST') &&
    secondBackend === 'DEVICE_LOST' &&
    disposed === 'ok';
  const recovered = recreated === 'ok' && afterRecreate === 'ok';
  return { mode, fault: warm === 'ok' ? fault : `warm-up failed: ${warm}`, refusedAfter, secondBackend, disposed, recreated, afterRecreate, recovered, passed };
}
