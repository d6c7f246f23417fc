import { type BackendFactory, formatReport, runConformance } from '@crisp/conformance';

/** Run the suite against a backend from a plain Node script (no vitest needed). */
export async function checkBackend(factory: BackendFactory, seed?: number) {
  const report = await runConformance(factory, {
    seed, // omit for a fresh random seed each run; failures print it
    sizes: 'small', // or 'large' on a GPU machine (n up to 65536, sampled rows)
    dtypes: ['f32', 'bf16'],
    filter: /^(proxyStats|sparseAttention)\/.*n200/, // optional: a subset of cases
    skip: { 'sparseAttention/vs/*/bf16': 'example: skipped cases are reported with the reason' },
    onResult: (r) => console.log(`${r.passed ? 'ok  ' : 'FAIL'} ${r.name}`),
  });
  console.log(formatReport(report)); // counts, and every failure with its seed
  return report;
}
