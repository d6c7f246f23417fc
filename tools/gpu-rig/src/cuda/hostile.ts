/**
 * Phases hostile and sticky: the soak (soak.ts) and the explicit fault cases
 * (fault-cases.ts) on a backend with a fault injector, then the sticky fault in a process of
 * its own (a faulted context is the whole process's), which the phase starts: this bundle
 * again with --phase sticky. Writes OUT/hostile.json (and OUT/sticky/sticky.json) and ends the
 * log with "hostile: PASSED" or "hostile: FAILED ...".
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createCudaBackend, CudaFaults } from '@crisp/kernels-cuda';
import { createReferenceBackend } from '@crisp/reference';
import { arg, budget, outDir } from './args.js';
import { be } from './backend.js';
import { type StickyResult, explicitFaultCases, stickyCase } from './fault-cases.js';
import { elapsed, log, step } from './harness.js';
import { runSoak } from './soak.js';

const KERNELS = { kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin' } as const;

export async function hostilePhase(): Promise<void> {
  await step('hostile', async () => {
    const faults = new CudaFaults();
    const target = await createCudaBackend({ ...KERNELS, faults });
    const foreign = createReferenceBackend();
    const calls = Number(arg('calls', '1000'));
    const seed = Number(arg('seed', '37'));
    // the soak leaves ~45 s of the budget to the fault cases and the sticky process
    const summary = await runSoak(
      { backend: target, faults, foreign },
      { calls, seed, strictPolicy: arg('strictPolicy', 'on') === 'on', budgetMs: Math.max(10_000, budget - elapsed() - 45_000), log },
      explicitFaultCases,
    );
    target.dispose();
    foreign.dispose();
    const sticky = stickyChild();
    const passed = summary.passed && sticky.passed;
    const result = { ...summary, sticky, passed };
    writeFileSync(join(outDir, 'hostile.json'), JSON.stringify(result, null, 1));
    const mem = summary.memory;
    log(
      `hostile: ${summary.completed} calls (${summary.warmUpCalls} warm-up), lost ${summary.lost}, unexpected ${summary.unexpected}, ` +
        `fault cases ${summary.faultCases.filter((c) => c.passed).length}/${summary.faultCases.length}, sticky ${sticky.passed ? 'ok' : JSON.stringify(sticky)} (a new backend after it: ${sticky.recovered ? 'worked' : `did not work: ${sticky.recreated} / ${sticky.afterRecreate}`}), ` +
        `free memory drop ${mem.freeDropBytes} B, live delta ${mem.liveDeltaBytes} B, checked rows ${summary.checkedRows}, ${(summary.wallMs / 1000).toFixed(1)} s`,
    );
    for (const f of summary.failures.slice(0, 20)) log(`  ${f}`);
    log(passed ? 'hostile: PASSED' : `hostile: FAILED${summary.stoppedEarly ? ' (stopped early by the time budget)' : ''}`);
    return { passed, lost: summary.lost, unexpected: summary.unexpected, byCode: summary.byCode, memory: mem, sticky };
  });
}

/** The sticky case in a child process: this bundle with --phase sticky. */
function stickyChild(): StickyResult & { readonly child?: string } {
  const dir = join(outDir, 'sticky');
  const res = spawnSync(process.execPath, [process.argv[1], '--phase', 'sticky', '--out', dir, '--budget', '90'], { encoding: 'utf8', timeout: 100_000 });
  writeFileSync(join(outDir, 'sticky.log'), `${res.stdout ?? ''}${res.stderr ?? ''}`);
  try {
    return JSON.parse(readFileSync(join(dir, 'sticky.json'), 'utf8')) as StickyResult;
  } catch (e) {
    const why = `the sticky process wrote no result (status ${res.status}, signal ${res.signal}, ${(e as Error).message})`;
    return { mode: 'corrupt', fault: why, refusedAfter: [], secondBackend: '', disposed: '', recreated: '', afterRecreate: '', recovered: false, passed: false, child: why };
  }
}

export async function stickyPhase(): Promise<void> {
  await step('sticky', async () => {
    // every holder of the device's primary context lets go before the fault: the new backend
    // at the end must get a fresh context
    be.dispose();
    const result = await stickyCase((faults) => createCudaBackend({ ...KERNELS, faults }), 'corrupt', true);
    writeFileSync(join(outDir, 'sticky.json'), JSON.stringify(result, null, 1));
    log(`sticky: ${JSON.stringify(result)}`);
    return result;
  });
}
