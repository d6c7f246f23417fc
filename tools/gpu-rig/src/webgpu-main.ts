/**
 * A GPU-machine run of @crisp/kernels-webgpu (Dawn over Vulkan): build report, checks and
 * timings of the attention kernels in one process, written to --out after every item so a
 * killed run still leaves its data.
 *
 *   node webgpu-main.mjs --out $OUT [flags]
 *
 * Flags (all optional; LIST = comma-separated numbers):
 *   --out DIR|FILE.json  results (default ./webgpu-device-out). A directory gets
 *                        webgpu-device.json, webgpu-device.log, build-report.json and
 *                        wgsl/<kernel>.wgsl; a FILE.json path puts the log and the rest next to it.
 *   --no-wgsl            do not write wgsl/<kernel>.wgsl (the device tool returns few files)
 *   --budget S           seconds for the whole run (default 420); each phase stops early (and
 *                        says so in the JSON) when its projected time would overrun.
 *   --variants V,...     attention kernels (default fma and the three subgroup-matrix forms). A variant is
 *                        KERNEL[:FORM][+TOGGLES]: FORM rolled (the FMA kernel's compactKernels
 *                        loops) or pipelined|staged|direct|two-pass (subgroup-matrix forms); TOGGLES fast (Dawn device toggles disable_robustness,
 *                        disable_workgroup_init, skip_validation) | norobust
 *                        (disable_robustness only). Each variant has its own Dawn device.
 *                        A subgroup-matrix FORM may name parts to leave out, FORM~PART~...
 *                        (stage, softmax, pv): a timing-only build that shows what a part
 *                        costs (its output is not attention; its check fails by design).
 *   --probes LIST        fma,lds,robust (default all; empty = none): FMA peak (fma()),
 *                        the workgroup-memory GEMM ceiling of the FMA kernel's tiling,
 *                        and whether the toggles reached the device (out-of-bounds read)
 *   --best-dense LIST    extra dense sizes for the best plain variant after the sweep
 *                        (default empty)
 *   --check N            float64 correctness size per variant, dense and sparse (default 4096)
 *   --dense LIST         dense sweep (default 8192,16384,32768,65536)
 *   --sparse LIST        crisp-preset sparse vs own dense, best variant (default 32768,65536,131072)
 *   --tfjs LIST          TF.js peer sizes (default 8192,16384; empty = skip)
 *   --smm-probe N        subgroup-matrix GEMM probe size (default 8192; 0 = skip)
 *   --proxy LIST         proxy statistics per correct variant at these n (default 8192,32768,65536;
 *                        empty = skip): wall and GPU time, and the statistics against the first variant's
 *   --conformance LIST   @crisp/conformance (f16, best variant) at these n (0: the CI sizes, with
 *                        chunked prefill and varlen), last, if 40 s remain
 *                        (default 4000; empty = skip)
 *   --heads H --kvheads HKV   (default 32, 8); d is 128
 *   --smoke              tiny sizes for an end-to-end check on a CPU adapter (SwiftShader)
 *
 * Order: (a) WGSL compilation messages (getCompilationInfo) and pipeline errors of every
 * variant, before anything is timed; (b) correctness of each variant at --check n against
 * float64 on sampled (row, head) pairs; (c) dense TFLOP/s per variant; (d) the sparse pipeline
 * with the best correct variant vs its own dense (density, plan ms, attention ms, ratio to
 * density × dense + plan); (e) the TF.js peer; (f) the proxy statistics of each correct variant
 * (its score tiles, time, and agreement with the first variant's); then @crisp/conformance
 * with the best variant.
 * "Best plain variant" (the --best-dense sizes, conformance, sparse, the TF.js ratio): the
 * fastest correct variant with Dawn's default toggles (what a browser runs), `rolled` excluded.
 * Conformance also runs with the experimental subgroup-matrix kernel when it was correct.
 *
 * Inputs for timing are generated on the GPU (a WGSL kernel: seeded noise plus sink keys,
 * a few vertical-line keys and a positional component that makes a local window), so
 * 128k-token tensors never pass through JavaScript.
 *
 * Shape legend: q [n, H, d], k and v [n, Hkv, d].
 */
import { createNodeWebGpuBackend } from '@crisp/kernels-webgpu/node';
import { TFJS } from './webgpu/args.js';
import { buildPhase, describeDevice } from './webgpu/build.js';
import { conformancePhase } from './webgpu/conformance.js';
import { correctnessPhase } from './webgpu/correctness.js';
import { densePhase } from './webgpu/dense.js';
import { elapsed, log, result, save } from './webgpu/harness.js';
import { probesPhase, subgroupMatrixProbePhase } from './webgpu/probes.js';
import { proxyPhase } from './webgpu/proxy.js';
import { sparsePhase } from './webgpu/sparse.js';
import { tfjsPeer } from './webgpu/tfjs.js';

// The phases in order: (a) build, the subgroup-matrix probe, (b) correctness, the probes,
// (c) dense, (f) the proxy statistics, conformance, (d) sparse, (e) the TF.js peer.
async function main(): Promise<void> {
  const base = await createNodeWebGpuBackend();
  describeDevice(base);
  const variants = await buildPhase();
  await subgroupMatrixProbePhase(base);
  await correctnessPhase(variants);
  await probesPhase(base, variants);
  const bestPlain = await densePhase(variants);
  await proxyPhase(variants);
  await conformancePhase(variants, bestPlain);
  await sparsePhase(bestPlain);

  if (TFJS.length) result.tfjs = await tfjsPeer(TFJS, bestPlain);

  result.finishedSeconds = elapsed() / 1000;
  log('done', result.finishedSeconds);
  save();
  for (const vr of variants) vr.b.dispose();
  base.dispose();
}

main().catch((e) => {
  result.fatal = String(e instanceof Error ? e.stack : e);
  save();
  log('FATAL', result.fatal);
  process.exitCode = 1;
});
