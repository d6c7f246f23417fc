/** Phase bench: dense vs sparse at the Llama shape, CRISP end to end, and the sparse/dense crossover. */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type BlockMask, type DeviceTensor, maskDensity, numBlocks, sparsePrefill, selectVsLists } from '@crisp/core';
import { crisp } from '@crisp/presets';
import { scenario, uploadScenario } from '@crisp/synth';
import { arg, budget, ns, crossNs, peerDir, reps, inputsKind, e2eNs } from './args.js';
import { be, timeIt } from './backend.js';
import { elapsed, log, step, median, causalFlops } from './harness.js';
import { H, Hkv, D, B, fullVsMask, patternMask } from './shapes.js';

const peerManifest: {
  ns: number[];
  rows: Record<string, string>;
  files: Record<string, string[]>;
  probe: Record<string, string>;
} = {
  ns: [],
  probe: {},
  rows: {},
  files: {},
};

export async function benchPhase(): Promise<void> {
  for (const n of ns) {
    await step(`dense_vs_sparse_${n}`, async () => {
      const Nb = numBlocks(n, B);
      const q = be.allocate('bf16', [n, H, D]);
      const k = be.allocate('bf16', [n, Hkv, D]);
      const v = be.allocate('bf16', [n, Hkv, D]);
      const od = be.allocate('bf16', [n, H, D]);
      const os = be.allocate('bf16', [n, H, D]);
      try {
        be.fillHash(q, 1, 2);
        be.fillHash(k, 2, 2);
        be.fillHash(v, 3, 1);
        be.poison(od);
        be.poison(os);
        const big = n >= 262144;
        const r = big ? 2 : reps;
        const dense = await timeIt(() => be.denseAttention(q, k, v, { out: od }), r, big ? 0 : 1);
        const full = fullVsMask(Nb);
        const sparseFull = await timeIt(() => be.sparseAttention(q, k, v, full, { out: os }), big ? 1 : r, big ? 0 : 1);
        const eq = be.relError(os, od);
        const selfD = be.relError(od, od);
        const pm = patternMask(Nb, 16, 64);
        const rows = await be.expandMask(pm);
        const blocks = rows.rowPtr[rows.rowPtr.length - 1];
        const os2 = be.allocate('bf16', [n, H, D]);
        const sparsePat = await timeIt(() => be.sparseAttention(q, k, v, pm, { out: os2 }), 2);
        os2.dispose();
        const causal = H * ((Nb * (Nb + 1)) / 2);
        const dMs = median(dense);
        const pMs = median(sparsePat);
        // rows for the PyTorch peer: every 61st row plus the last 128
        const sample: number[] = [];
        for (let i = 0; i < n; i += 61) sample.push(i);
        for (let i = n - 128; i < n; i++) if (i % 61 !== 0) sample.push(i);
        const idx = Int32Array.from(sample);
        const rowsFile = join(peerDir, `rows_${n}.i32`);
        writeFileSync(rowsFile, idx);
        const denseRows = be.readRows(od, idx);
        writeFileSync(join(peerDir, `dense_${n}.bf16`), denseRows.data as Uint16Array);
        writeFileSync(join(peerDir, `sparsefull_${n}.bf16`), be.readRows(os, idx).data as Uint16Array);
        const probe = join(peerDir, `qprobe_${n}.bf16`);
        writeFileSync(probe, be.readRows(q, Int32Array.from([0, 1, n - 1])).data as Uint16Array);
        peerManifest.probe[n] = probe;
        peerManifest.ns.push(n);
        peerManifest.rows[n] = rowsFile;
        peerManifest.files[n] = [join(peerDir, `dense_${n}.bf16`), join(peerDir, `sparsefull_${n}.bf16`)];
        writeFileSync(join(peerDir, 'manifest.json'), JSON.stringify({ H, Hkv, D, seeds: [1, 2, 3], amps: [2, 2, 1], ...peerManifest }));
        const res = {
          n,
          denseMs: dense,
          denseTflops: causalFlops(n, H, D) / (dMs * 1e-3) / 1e12,
          sparseFullMaskMs: sparseFull,
          sparseFullVsDense: eq,
          denseNonFinite: selfD.nonFinite,
          pattern: { blocks, causalBlocks: causal, density: blocks / causal, ms: sparsePat },
          usPerBlockDense: (dMs * 1000) / causal,
          usPerBlockSparse: (pMs * 1000) / blocks,
          usPerBlockSparseFull: (median(sparseFull) * 1000) / causal,
        };
        log(
          `n=${n} dense ${dMs.toFixed(1)} ms (${res.denseTflops.toFixed(0)} TFLOP/s) sparse(full) ${median(sparseFull).toFixed(1)} ms relErr ${eq.relErr.toExponential(2)} nonfinite ${eq.nonFinite}; pattern d=${res.pattern.density.toFixed(3)} ${pMs.toFixed(1)} ms, us/block ${res.usPerBlockSparse.toFixed(3)} vs dense ${res.usPerBlockDense.toFixed(3)}`,
        );
        return res;
      } finally {
        for (const t of [q, k, v, od, os]) t.dispose();
      }
    });
  }

  const makeInputs = async (n: number): Promise<{ q: DeviceTensor; k: DeviceTensor; v: DeviceTensor }> => {
    if (inputsKind !== 'synth') {
      const t = { q: be.allocate('bf16', [n, H, D]), k: be.allocate('bf16', [n, Hkv, D]), v: be.allocate('bf16', [n, Hkv, D]) };
      be.fillLlamaLike(t.q, t.k, t.v, 7);
      return t;
    }
    const sc = scenario('llama-like', { n, heads: H, kvHeads: Hkv, headDim: D, dtype: 'bf16', seed: 1 });
    const tg = performance.now();
    let lastLog = tg;
    const up = await uploadScenario(be, sc, {
      onProgress: (done, total) => {
        if (performance.now() - lastLog > 15000) {
          lastLog = performance.now();
          log(`  synth ${done}/${total} rows`);
        }
      },
    });
    log(`  synth llama-like n=${n} generated and uploaded in ${((performance.now() - tg) / 1000).toFixed(1)} s`);
    return up;
  };

  const e2e = async (n: number, r: number, withDense: boolean) => {
    const { q, k, v } = await makeInputs(n);
    const os = be.allocate('bf16', [n, H, D]);
    const od = be.allocate('bf16', [n, H, D]);
    const oh = be.allocate('bf16', [n, H, D]);
    const inputs = { q, k, v } as { q: DeviceTensor; k: DeviceTensor; v: DeviceTensor };
    try {
      be.poison(os);
      await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os }); // warm-up
      await be.synchronize();
      const runs: { planMs: number; attentionMs: number; totalMs: number }[] = [];
      let last: Awaited<ReturnType<typeof sparsePrefill>> | undefined;
      for (let i = 0; i < r; i++) {
        await be.synchronize();
        last = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
        runs.push(last.timings);
      }
      const plan = last?.plan;
      const total = median(runs.map((x) => x.totalMs));
      const planMs = median(runs.map((x) => x.planMs));
      // --headstart MS: the same prefill r more times, each behind a device wait of MS ms, so
      // the host has queued the whole plan before the device starts it: the plan's device
      // critical path alone, against planMs above (which also holds the host's launch time
      // wherever the device waited for it)
      let headstart: { ms: number; planMs: number[]; totalMs: number[] } | undefined;
      const hs = Number(arg('headstart', '0'));
      if (hs > 0) {
        const hr: { planMs: number; totalMs: number }[] = [];
        for (let i = 0; i < r; i++) {
          await be.synchronize();
          be.deviceSleep(hs);
          hr.push((await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os })).timings);
        }
        headstart = { ms: hs, planMs: hr.map((x) => x.planMs), totalMs: hr.map((x) => x.totalMs) };
        log(
          `  ${n} plan ${planMs.toFixed(3)} ms; behind a ${hs} ms device head start ${median(headstart.planMs).toFixed(3)} ms (runs ${headstart.planMs.map((x) => x.toFixed(3)).join(' ')})`,
        );
      }
      // pieces of the plan, device-timed
      const proxyMs = await be.timeMs(() =>
        be.proxyStats(q, k, { blockSize: B, wSink: 128, wLocal: 128 }),
      );
      const peHeads = plan?.routing ? plan.routing.routes.flatMap((x, h) => (x === 'pe' ? [h] : [])) : [];
      const peMs = peHeads.length
        ? await be.timeMs(() => be.peBlockRows(q, k, { blockSize: B, gamma: 0.95, heads: peHeads }))
        : 0;
      // the host path on the plan's (complete) mask: expanded again from the host arrays;
      // must give the prepared path's output bit for bit, and the host density count the
      // device's
      be.poison(oh);
      const sparseKernelMs = plan?.mask ? await be.timeMs(() => be.sparseAttention(q, k, v, plan.mask as BlockMask, { out: oh })) : 0;
      const preparedVsHost = plan?.mask ? be.relError(os, oh) : undefined;
      // the VS lists (selected on the device when the backend offers it) against the host
      // selector on the plan's own statistics: must be equal
      let vsVsHost: string | undefined;
      if (plan?.stats && plan.routing && plan.mask?.vs) {
        const want = selectVsLists(plan.stats, plan.routing.routes, crisp.vs!, Math.ceil(crisp.pe!.kMin / B));
        const got = plan.mask.vs;
        const same = (a: Int32Array, b: Int32Array) => a.length === b.length && a.every((x, i) => x === b[i]);
        vsVsHost =
          same(got.verticalPtr, want.verticalPtr) && same(got.vertical, want.vertical) && same(got.slashPtr, want.slashPtr) && same(got.slash, want.slash)
            ? 'equal'
            : 'DIFFERENT';
      }
      const hostDensity = plan?.mask ? maskDensity(plan.mask).overall : undefined;
      // --profileToo 1: one more prefill with every launch serialised and device-timed, on
      // the same inputs (synth inputs at 512k take ~80 s to make)
      let profile: { kernels: unknown; phases: unknown } | undefined;
      if (arg('profileToo', '') === '1') {
        be.startProfile();
        const pr = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
        const kernels = be.stopProfile();
        profile = { kernels, phases: pr.plan.phases };
        for (const x of kernels.slice(0, 16)) log(`  ${n} ${x.kernel}: ${x.ms.toFixed(3)} ms (${x.calls} calls)`);
        log(`  ${n} plan phases (profiled, serialised) ${JSON.stringify(pr.plan.phases)}`);
      }
      // --trace 1: one more prefill with a timeline of its launches (not serialised): device
      // start/end of each kernel and the host's clock at each launch and synchronous read
      let trace: unknown;
      if (arg('trace', '') === '1') {
        await be.synchronize();
        be.startTrace();
        const tr = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
        const entries = be.stopTrace();
        trace = { entries, timings: tr.timings };
        // idle-before per stream: a device plan's router and PE kernels run on a second one
        const prevEnd = { main: 0, side: -1, tail: -1 };
        for (const e of entries) {
          if (e.startMs === undefined) {
            log(`  trace ${n} host ${e.hostMs.toFixed(3)}..${e.hostEndMs?.toFixed(3)} ${e.name}`);
            continue;
          }
          const st = e.stream ?? 'main';
          const gap = prevEnd[st] < 0 ? 0 : e.startMs - prevEnd[st];
          log(
            `  trace ${n} host ${e.hostMs.toFixed(3)} dev ${e.startMs.toFixed(3)}..${e.endMs!.toFixed(3)} (${(e.endMs! - e.startMs).toFixed(3)}) idle-before ${gap.toFixed(3)}${st === 'main' ? '' : ` [${st}]`} ${e.name}`,
          );
          prevEnd[st] = e.endMs!;
        }
        log(`  trace ${n} timings ${JSON.stringify(tr.timings)}`);
      }
      let dense: number[] = [];
      let err: unknown;
      if (withDense) {
        dense = await timeIt(() => be.denseAttention(q, k, v, { out: od }), n >= 262144 ? 1 : r, n >= 262144 ? 0 : 1);
        err = be.relError(os, od);
      }
      return {
        n,
        inputs: inputsKind,
        policy: crisp.name,
        phases: last?.plan.phases,
        totalMs: runs.map((x) => x.totalMs),
        planMs: runs.map((x) => x.planMs),
        attentionMs: runs.map((x) => x.attentionMs),
        medianTotalMs: total,
        planShare: planMs / total,
        proxyStatsMs: proxyMs,
        peRowsMs: peMs,
        sparseKernelMs,
        density: plan?.overallDensity,
        hostDensity,
        preparedVsHost,
        vsListsVsHostSelector: vsVsHost,
        denseReason: plan?.denseReason,
        routes: plan?.routing ? { vs: plan.routing.routes.filter((x) => x === 'vs').length, pe: peHeads.length } : undefined,
        denseMs: dense,
        speedupVsOwnDense: dense.length ? median(dense) / total : undefined,
        outputVsDense: err,
        profile,
        trace,
        headstart,
      };
    } finally {
      for (const t of [q, k, v, os, od, oh]) t.dispose();
    }
  };

  if (arg('profile', '') === '1') {
    // One profiled CRISP prefill per size: each kernel's time on the device (launches serialised).
    for (const n of e2eNs) {
      await step(`profile_${n}`, async () => {
        const { q, k, v } = await makeInputs(n);
        const os = be.allocate('bf16', [n, H, D]);
        try {
          const inputs = { q, k, v };
          await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
          await be.synchronize();
          be.startProfile();
          const r = await sparsePrefill(be, inputs, crisp, { minSparseLength: 0, out: os });
          const kernels = be.stopProfile();
          for (const x of kernels.slice(0, 14)) log(`  ${n} ${x.kernel}: ${x.ms.toFixed(2)} ms (${x.calls} calls)`);
          log(`  ${n} plan phases (profiled, serialised) ${JSON.stringify(r.plan.phases)} density ${r.plan.overallDensity.toFixed(4)}`);
          return { n, inputs: inputsKind, kernels, phases: r.plan.phases, density: r.plan.overallDensity };
        } finally {
          for (const t of [q, k, v, os]) t.dispose();
        }
      });
    }
  }

  // --profile 1 profiles the --e2e sizes instead of timing them (each size's inputs are made
  // once: synth inputs at 512k take ~80 s on the GPU machine's host)
  const e2eList =
    arg('e2e', '') === 'none' || arg('profile', '') === '1' ? [] : e2eNs.length ? e2eNs : ns.filter((x) => x >= 131072).sort((x, y) => y - x);
  for (const n of e2eList) {
    await step(`crisp_e2e_${n}`, async () => {
      const r = await e2e(n, inputsKind === 'synth' || n < 262144 ? 3 : 1, true);
      log(
        `crisp n=${n}: total ${r.medianTotalMs.toFixed(1)} ms (plan share ${(100 * r.planShare).toFixed(1)}%, proxy ${r.proxyStatsMs.toFixed(1)} ms, pe ${Number(r.peRowsMs).toFixed(1)} ms, kernel ${r.sparseKernelMs.toFixed(1)} ms) density ${r.density?.toFixed(4)} (host count ${r.hostDensity?.toFixed(4)}, prepared vs host ${JSON.stringify(r.preparedVsHost)}, VS lists vs host selector ${r.vsListsVsHostSelector}) phases ${JSON.stringify(r.phases)} routes ${JSON.stringify(r.routes)} dense ${r.denseMs.map((x) => x.toFixed(0))} err ${JSON.stringify(r.outputVsDense)}`,
      );
      return r;
    });
  }
  if (crossNs.length) await step('crossover', async () => {
    const pts = [];
    for (const n of crossNs) {
      if (elapsed() > budget) break;
      const r = await e2e(n, 5, true);
      pts.push({ n, crispMs: r.medianTotalMs, denseMs: median(r.denseMs), density: r.density, planShare: r.planShare });
      log(`crossover n=${n}: crisp ${r.medianTotalMs.toFixed(2)} ms vs dense ${median(r.denseMs).toFixed(2)} ms (density ${r.density?.toFixed(3)})`);
    }
    return { points: pts };
  });
}
