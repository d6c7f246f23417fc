/** (a) The device description, then the build report of every variant: WGSL compilation messages and pipeline errors, before anything is timed. */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { WebGpuBackend } from '@crisp/kernels-webgpu';
import { D, H, HKV, VARIANTS, budgetMs, flagsFor, outDir, smoke, writeWgsl } from './args.js';
import { log, result, save } from './harness.js';
import { type Variant, backendFor } from './variants.js';

/** Compile one program on the device: every WGSL message and the pipeline error, if any. */
async function buildReport(device: GPUDevice, name: string, wgsl: string): Promise<Record<string, unknown>> {
  if (writeWgsl) writeFileSync(join(outDir, 'wgsl', `${name}.wgsl`), wgsl);
  const t0 = performance.now();
  const rep: Record<string, unknown> = { program: name };
  try {
    device.pushErrorScope('internal');
    device.pushErrorScope('validation');
    const module = device.createShaderModule({ code: wgsl, label: name });
    const info = await module.getCompilationInfo();
    const msgs = info.messages.map((m) => ({ type: m.type, line: m.lineNum, col: m.linePos, message: m.message }));
    // Deprecation warnings repeat once per call site: keep errors whole, count the rest.
    rep.errors = msgs.filter((m) => m.type === 'error');
    const others = new Map<string, { count: number; first: unknown }>();
    for (const m of msgs.filter((x) => x.type !== 'error')) {
      const k = `${m.type}: ${m.message}`;
      const e = others.get(k);
      if (e) e.count++;
      else others.set(k, { count: 1, first: m });
    }
    rep.otherMessages = [...others.entries()].map(([k, v]) => ({ message: k, count: v.count, first: v.first }));
    device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' }, label: name });
    const ve = await device.popErrorScope();
    const ie = await device.popErrorScope();
    rep.validationError = ve ? ve.message : null;
    rep.internalError = ie ? ie.message : null;
    rep.ok = !ve && !ie && (rep.errors as unknown[]).length === 0;
  } catch (e) {
    rep.exception = String(e instanceof Error ? (e.stack ?? e.message) : e);
    rep.ok = false;
  }
  rep.ms = performance.now() - t0;
  return rep;
}

/** The adapter (info, features, limits, subgroup sizes and subgroup-matrix configs) and the run's shape, into the results and the log. */
export function describeDevice(base: WebGpuBackend): void {
  const adapter = base.gpu.keepAlive[1] as GPUAdapter | undefined;
  result.device = base.info;
  const ai = adapter?.info as unknown as Record<string, unknown> | undefined;
  result.adapterInfo = ai
    ? {
        subgroupMinSize: ai.subgroupMinSize,
        subgroupMaxSize: ai.subgroupMaxSize,
        subgroupMatrixConfigs: [...((ai.subgroupMatrixConfigs as Record<string, unknown>[] | undefined) ?? [])].map((c) => ({
          componentType: c.componentType,
          resultComponentType: c.resultComponentType,
          M: c.M,
          N: c.N,
          K: c.K,
        })),
      }
    : undefined;
  log('adapter', base.info.vendor, base.info.architecture, base.info.description, base.info.features.join(' '), result.adapterInfo, base.info.limits);
  log('shape', { H, HKV, D, budgetS: budgetMs / 1000, variants: VARIANTS, smoke });
  save();
}

/** Every variant on its own backend, with its programs built and reported; a variant that does not build is stopped. */
export async function buildPhase(): Promise<Variant[]> {
  const variants: Variant[] = [];
  const builds: Record<string, unknown>[] = [];
  result.build = builds;
  for (const spec of VARIANTS) {
    // Each variant gets its own Dawn instance and device: a driver fault or device loss in
    // an experimental kernel then takes down that variant only; toggles are per device.
    const name = spec.label;
    const b = await backendFor(spec);
    const programs: [string, string][] = [];
    const k = spec.kernel;
    if (k === 'subgroup-matrix') programs.push([name, b.attentionProgramFor(k, 'f16', D).wgsl]);
    else programs.push([`${name}-f16`, b.attentionProgramFor(k, 'f16', D).wgsl], [`${name}-f32`, b.attentionProgramFor(k, 'f32', D).wgsl]);
    let ok = true;
    for (const [pname, wgsl] of programs) {
      const rep = await buildReport(b.gpu.device, pname, wgsl);
      rep.variant = name;
      rep.flags = flagsFor(spec.toggles);
      rep.eligible = b.attentionKernel === k;
      ok &&= rep.ok === true;
      builds.push(rep);
      log('build', pname, rep.ok ? 'OK' : 'FAILED', { eligible: rep.eligible, errors: rep.errors, validationError: rep.validationError, internalError: rep.internalError, exception: rep.exception, otherMessages: (rep.otherMessages as unknown[]).length, ms: Math.round(rep.ms as number) });
      writeFileSync(join(outDir, 'build-report.json'), JSON.stringify(builds, null, 1));
      save();
    }
    const vr: Variant = { ...spec, b, active: b.attentionKernel, buildOk: ok };
    if (!ok) vr.stopped = 'did not build (see build report)';
    variants.push(vr);
  }
  return variants;
}
