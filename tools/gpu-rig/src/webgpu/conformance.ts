/** @crisp/conformance (f16) at the --conformance sizes with the best plain variant, and the subgroup-matrix kernel where it ran correctly. */
import { LARGE_SIZES, runConformance } from '@crisp/conformance';
import { type VariantSpec, list, smoke } from './args.js';
import { left, log, result, save } from './harness.js';
import { type Variant, backendFor } from './variants.js';

export async function conformancePhase(variants: Variant[], bestPlain: Variant | undefined): Promise<void> {
  const confSizes = list('conformance', smoke ? '' : '4000');
  if (confSizes.length) {
    const reports: unknown[] = [];
    result.conformance = reports;
    // The best plain variant, and each form of the tensor-core kernel that ran correctly.
    const specs: VariantSpec[] = [bestPlain ?? { label: 'fma', kernel: 'fma' }];
    for (const smm of variants.filter((v) => v.kernel === 'subgroup-matrix' && v.correct && !v.toggles)) if (smm !== bestPlain) specs.push(smm);
    for (const spec of specs) {
      for (const n of confSizes) {
        const kernel = spec.label;
        // n = 0: the CI sizes (chunked prefill, short m, varlen batches), every case
        if (left(1) < (n > 16384 ? 60000 : 30000)) {
          reports.push({ n, kernel, skipped: 'time budget' });
          log('conformance skip', n, 'time budget');
          save();
          continue;
        }
        const sizes = n === 0 ? ('small' as const) : LARGE_SIZES.filter((s) => s.n === n && (s.m ?? s.n) === s.n);
        const t0 = performance.now();
        const rep = await runConformance(() => backendFor(spec), {
          sizes,
          dtypes: ['f16'],
          filter: n > 4096 ? /^(denseAttention|sparseAttention\/vs|proxyStats)/ : undefined,
          onResult: (x) => log(x.passed ? 'pass' : x.skipped ? 'skip' : 'FAIL', x.name, x.skipped ?? x.detail.slice(0, 200)),
        });
        reports.push({
          n,
          kernel,
          seconds: (performance.now() - t0) / 1000,
          seed: rep.seed,
          passed: rep.passed,
          counts: rep.counts,
          failures: rep.results.filter((x) => !x.passed && !x.skipped).map((x) => ({ name: x.name, detail: x.detail })),
          skipped: rep.results.filter((x) => x.skipped).map((x) => `${x.name}: ${x.skipped}`),
        });
        log('conformance', n, kernel, rep.passed ? 'PASSED' : 'FAILED', rep.counts);
        save();
      }
    }
  }
}
