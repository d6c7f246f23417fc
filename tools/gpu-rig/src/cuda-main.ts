/**
 * One device-machine run: conformance (n <= 16k), correctness at 64k..512k against the
 * dense kernel (and files for the PyTorch peer), dense and sparse timings at the Llama
 * shape, CRISP end to end on the llama-like layer, and the sparse/dense crossover.
 * Writes JSON to --out after every step, so a run cut short still reports.
 *
 *   node .device/app/cuda-main.mjs --phase all --out $OUT --budget 420
 *
 * --phase kernels: every attention layout (--layouts, default all) self-checked against w32, then
 * timed dense and on a regular sparse pattern at --sweep sizes; --headDim 64 for d = 64.
 *
 * --phase dump: the llama fill at --dumpN tokens written to --dumpPath as safetensors (for crisp run --qkv).
 *
 * --phase hostile: the hostile-input soak (--calls N, --seed S, --strictPolicy on|off) and the
 * fault cases, then the sticky fault in a child process (--phase sticky): OUT/hostile.json.
 */
import { checkN, phase } from './cuda/args.js';
import { be } from './cuda/backend.js';
import { benchPhase } from './cuda/bench.js';
import { conformancePhase } from './cuda/conformance.js';
import { dumpPhase } from './cuda/dump.js';
import { log, results, save } from './cuda/harness.js';
import { hostilePhase, stickyPhase } from './cuda/hostile.js';
import { kernelsCheckPhase, kernelsPhase } from './cuda/kernels.js';
import { proxyPhase } from './cuda/proxy.js';

// Phases run in this order; --phase all runs conformance and bench.
if (phase === 'all' || phase === 'conformance') await conformancePhase();
if (phase === 'kernels' && checkN > 0) await kernelsCheckPhase();
if (phase === 'proxy') await proxyPhase();
if (phase === 'kernels') await kernelsPhase();
if (phase === 'all' || phase === 'bench') await benchPhase();
if (phase === 'dump') await dumpPhase();
if (phase === 'hostile') await hostilePhase();
if (phase === 'sticky') await stickyPhase();
results.finished = new Date().toISOString();
results.compileMs = be.compileMs;
save();
be.dispose();
log('end');
