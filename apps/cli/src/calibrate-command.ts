/** `crisp calibrate`: how realistic a scenario's attention looks (see @crisp/synth calibrate). */
import { calibrateScenario, scenario } from '@crisp/synth';
import { selectBackend } from './backends.js';
import type { CliIo } from './cli-io.js';
import { formatCalibration, toJson } from './format.js';
import { scenarioDims } from './inputs.js';
import { checkProblem } from './limits.js';
import type { ScenarioChoice } from './run-job.js';

export interface CalibrateCommandOptions extends ScenarioChoice {
  readonly blockSize: number;
  readonly tauProxy?: number;
  readonly json: boolean;
}

export async function calibrateCommand(o: CalibrateCommandOptions, io: CliIo): Promise<void> {
  const sel = await selectBackend(o.backend);
  for (const note of sel.notes) io.stderr.write(`note: ${note}\n`);
  try {
    // 16 heads by default: with one diffuse head in 16 the paper's ">= 90% anchored" target is reachable.
    const dims = scenarioDims(o, sel.defaults, 16);
    const dtype = o.dtype ?? sel.dtype;
    checkProblem(
      sel.backend,
      { n: dims.n, H: dims.heads, Hkv: dims.kvHeads, d: dims.headDim, dtype, blockSize: o.blockSize, sampleRows: 0, policies: 0 },
      { kind: 'flags' },
    );
    const sc = scenario(o.profile, { ...dims, dtype, seed: o.seed });
    const rep = await calibrateScenario(sel.backend, sc, { blockSize: o.blockSize, tauProxy: o.tauProxy });
    if (o.json) {
      io.stdout.write(`${toJson({ backend: sel.name, profile: sc.profile, seed: sc.seed, heads: sc.heads, kvHeads: sc.kvHeads, headDim: sc.headDim, dtype: sc.dtype, ...rep })}\n`);
    } else {
      io.stdout.write(
        formatCalibration(
          rep,
          `crisp calibrate: ${sc.profile} (seed ${sc.seed}), n=${sc.n}, H=${sc.heads}, Hkv=${sc.kvHeads}, d=${sc.headDim}, ${sc.dtype}, B=${rep.blockSize}, backend ${sel.name}`,
        ),
      );
    }
  } finally {
    sel.backend.dispose();
  }
}
