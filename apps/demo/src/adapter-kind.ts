/**
 * Is the WebGPU adapter a CPU one (SwiftShader, llvmpipe/lavapipe, WARP, or what the browser
 * marks as a fallback adapter)? Its timings say nothing about a GPU, and large sizes take
 * minutes there, so the page says so before a run. DOM-free, so Node tests can check it.
 */
import type { DemoConfig } from './run-demo.js';

export interface AdapterFacts {
  readonly vendor?: string;
  readonly architecture?: string;
  readonly description?: string;
  /** GPUAdapterInfo.isFallbackAdapter (Chrome 136+) or the older GPUAdapter.isFallbackAdapter */
  readonly isFallbackAdapter?: boolean;
}

const SOFTWARE = /swiftshader|llvmpipe|lavapipe|softpipe|\bwarp\b|basic render|software/i;

/** The name of the CPU implementation behind the adapter, or null for a hardware GPU. */
export function cpuAdapterName(a: AdapterFacts): string | null {
  const text = [a.vendor, a.architecture, a.description].filter(Boolean).join(' ');
  const m = SOFTWARE.exec(text);
  if (m) return m[0].toLowerCase() === 'swiftshader' ? 'SwiftShader' : m[0];
  return a.isFallbackAdapter ? 'a fallback (software) adapter' : null;
}

/**
 * Floating-point work a CPU adapter gets through per second, and the fixed cost of a page's
 * first run (its shader compiles). From SwiftShader in headless Chromium on a shared 2-core
 * machine (the browser test): a first run at n = 1536, H = 4, d = 64 without warm-up took
 * 33 s (plan 11 s, sparse attention 18 s, dense 3 s), most of it compiling. Rough by design:
 * it tells seconds from minutes.
 */
const CPU_FLOPS = 1e9;
const COMPILE_S = 30;

/** Seconds a run of `cfg` takes on a CPU adapter (dense and sparse, warm-up and timed runs). */
export function cpuSecondsEstimate(cfg: Pick<DemoConfig, 'n' | 'heads' | 'headDim' | 'repeats' | 'warmup'>): number {
  // causal attention: n²/2 scores and as many weighted values, 2 flops each, per head
  const dense = 2 * cfg.n * cfg.n * cfg.heads * cfg.headDim;
  // a sparse run costs at most a dense one; count it as half, plus its planning pass (0.6);
  // each timed repeat runs the sparse prefill twice (whole, then plan and attention apart)
  const units = (cfg.warmup ? 1.6 : 0) + cfg.repeats * 2.2;
  return COMPILE_S + (units * dense) / CPU_FLOPS;
}

/** The warning to show before a run that will take minutes on a CPU adapter, or null. */
export function slowRunWarning(cpu: string | null, cfg: Pick<DemoConfig, 'n' | 'heads' | 'headDim' | 'repeats' | 'warmup'>): string | null {
  if (!cpu) return null;
  const s = cpuSecondsEstimate(cfg);
  if (s < 90) return null;
  const runs = cfg.repeats + (cfg.warmup ? 1 : 0);
  return `This size will take about ${Math.round(s / 60)} minutes on ${cpu} (n = ${cfg.n}, H = ${cfg.heads}, d = ${cfg.headDim}, ${runs} run${runs === 1 ? '' : 's'} of dense and of sparse): try n = 2048 first.`;
}
