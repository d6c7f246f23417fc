/** Phase conformance: the conformance suite (sizes up to --confMaxN) on a backend of its own. */
import { LARGE_SIZES, LARGE_VARLEN, SMALL_SIZES, SMALL_VARLEN, formatReport, runConformance } from '@crisp/conformance';
import { createCudaBackend } from '@crisp/kernels-cuda';
import { arg, confDtypes, proxyLayoutArg } from './args.js';
import { variant } from './backend.js';
import { results, save, log, step } from './harness.js';

export async function conformancePhase(): Promise<void> {
  await step('conformance', async () => {
    const maxN = Number(arg('confMaxN', '16384'));
    const sizes = [...SMALL_SIZES, ...LARGE_SIZES.filter((s) => s.n <= maxN)];
    // ragged batches: the CI shapes and the long ones whose longest sequence fits maxN
    const varlenSizes = [...SMALL_VARLEN, ...LARGE_VARLEN.filter((s) => Math.max(...(s.keys ?? s.queries)) <= maxN)];
    // runConformance disposes the backend it is given: give it its own
    const confFilter = arg('confFilter', '');
    // --confShard i/N: the i-th of N processes that run the suite between them
    const shardArg = arg('confShard', '');
    const [index, count] = shardArg ? shardArg.split('/').map(Number) : [0, 1];
    const rep = await runConformance(() => createCudaBackend({ kernelDir: 'packages/kernels-cuda/kernels', cacheDir: '/tmp/crisp-cubin', attentionVariant: variant, proxyLayout: proxyLayoutArg, flexPrefillOnDevice: true, peVsExcessOnDevice: true }), {
      sizes,
      varlenSizes,
      dtypes: confDtypes,
      ...(confFilter ? { filter: new RegExp(confFilter) } : {}),
      ...(shardArg ? { shard: { index, count } } : {}),
      onResult: (r) => {
        log(`${r.skipped ? 'skip' : r.passed ? 'pass' : 'FAIL'} ${r.name}${r.passed ? '' : `: ${r.detail.slice(0, 300)}`}`);
        // progressive: a run cut short by its time limit still reports what it checked
        const c = (results.conformanceSoFar ??= { passed: 0, failed: [], skipped: 0 });
        if (r.skipped) c.skipped++;
        else if (r.passed) c.passed++;
        else c.failed.push(`${r.name}: ${r.detail.slice(0, 300)}`);
        save();
      },
    });
    log(formatReport(rep).split('\n').slice(-3).join(' | '));
    return {
      passed: rep.passed,
      counts: rep.counts,
      seed: rep.seed,
      failures: rep.results.filter((r) => !r.passed && !r.skipped).map((r) => ({ name: r.name, detail: r.detail.slice(0, 600) })),
      skipped: rep.results.filter((r) => r.skipped).map((r) => `${r.name}: ${r.skipped}`),
    };
  });
}
