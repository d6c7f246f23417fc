/**
 * The vitest layer: `defineConformanceSuite` registers one `it` per conformance case.
 * Only this entry (`@crisp/conformance/vitest`) imports vitest, so GPU scripts that use
 * `runConformance` from the main entry never load it.
 *
 * @module @crisp/conformance/vitest
 */
import { afterAll, beforeAll, describe, it } from 'vitest';
import { type BackendFactory, type ConformanceOptions, ConformanceSession, listConformanceCases } from './runner.js';
import { DTYPES } from '@crisp/core';
import { randomSeed } from './random.js';

/**
 * Register the suite under `describe(name)`. Cases the backend's declared capabilities
 * exclude, or that `options.skip` names, are reported as skipped with the reason.
 * `options.onResult` is called with each case's result, as `runConformance` calls it.
 */
export function defineConformanceSuite(name: string, factory: BackendFactory, options: ConformanceOptions = {}): void {
  const seed = options.seed ?? randomSeed();
  const opts = { ...options, seed };
  const cases = listConformanceCases({ ...opts, dtypes: options.dtypes ?? DTYPES });
  describe(`${name} (conformance, run seed ${seed})`, () => {
    let session: ConformanceSession | undefined;
    beforeAll(async () => {
      session = await ConformanceSession.open(factory, opts);
    });
    afterAll(() => session?.close());
    for (const c of cases) {
      it(c.name, async (t) => {
        if (!session) throw new Error('the backend factory failed; see beforeAll');
        const r = await session.run(c);
        options.onResult?.(r);
        if (r.skipped !== undefined) {
          t.skip(r.skipped);
          return;
        }
        if (!r.passed) throw new Error(`${c.name} failed\n${r.detail}`);
      });
    }
  });
}
