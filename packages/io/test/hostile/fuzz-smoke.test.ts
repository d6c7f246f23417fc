// The fuzzer itself, briefly (the long run is `pnpm --filter @crisp/io fuzz`): a few
// thousand mutants through both parsers and some through files, with no crash, and the
// summary counting every input.
import { describe, expect, it } from 'vitest';
import { fuzz } from '../../scripts/fuzz-lib.js';
import { SEED, reportSeedOnFailure } from '../helpers.js';

reportSeedOnFailure('hostile/fuzz-smoke');

describe('fuzzer smoke run', () => {
  it('4000 mutants, every one a valid result or a CrispError', async () => {
    const s = await fuzz({ seconds: 60, seed: SEED, maxInputs: 4000, fileEvery: 50 });
    expect(s.crashes).toEqual([]);
    expect(s.targets.safetensors.inputs + s.targets.npy.inputs).toBe(4000);
    expect(s.targets.files.inputs).toBe(80);
    expect(s.totalInputs).toBe(4080);
    // Mutants reach both accepting and refusing paths of both parsers.
    for (const t of ['safetensors', 'npy'] as const) {
      expect(s.targets[t].outcomes.ok ?? 0).toBeGreaterThan(0);
      expect(s.targets[t].outcomes.FORMAT_ERROR ?? 0).toBeGreaterThan(0);
    }
  });
});
