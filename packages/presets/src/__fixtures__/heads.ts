/**
 * Crafted Q/K/V for the paper's claims, built so the proxy map Â has a chosen mass cliff.
 *
 * Logits are q · k with scale 1, one key channel per structure:
 *   channel 0: the sink token (key 0)           logit ln x_sink
 *   channel 1: the last block (local window)    logit ln x_local
 *   channel 2: the signal blocks' tokens         logit ln x_signal
 *   channel 3: seeded jitter on background keys  logit ~ N(0, jitter²)
 * Every query is (1, 1, 1, 1, r…) with seeded r in channels the keys leave at 0, so the
 * proxy rows differ only by what the causal mask lets them see. The x's are fitted
 * (iterative proportional fitting over the 128 proxy rows) so that the mean proxy masses
 * p_v[0], p_v[Nb−1] and Σ p_v[signal] hit the requested targets.
 */
import type { HostTensor } from '@crisp/core';
import { mulberry32 } from '@crisp/core';

/** mulberry32, from @crisp/core (one generator for every seeded input). */
export const rng: (seed: number) => () => number = mulberry32;

export function gaussian(r: () => number): () => number {
  return () => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
}

export function freshSeed(): number {
  return (Math.random() * 2 ** 31) >>> 0;
}

export interface CliffHeadSpec {
  readonly n: number;
  readonly blockSize: number;
  readonly sink: number;
  readonly local: number;
  readonly signal: number;
  readonly signalBlocks: readonly number[];
  readonly jitter: number;
  readonly seed: number;
}

export interface CliffHead {
  /** [n, 1, d] f32 */
  readonly q: HostTensor;
  readonly k: HostTensor;
  readonly v: HostTensor;
  readonly d: number;
}

/** One head (H = Hkv = 1, d = 16) whose proxy map has the requested block masses. */
export function cliffHead(spec: CliffHeadSpec): CliffHead {
  const { n, blockSize: B, signalBlocks, jitter } = spec;
  const d = 16;
  const Nb = Math.ceil(n / B);
  const r = rng(spec.seed);
  const g = gaussian(r);
  const isSignal = new Uint8Array(Nb);
  for (const J of signalBlocks) isSignal[J] = 1;
  // Background logits (block 0 besides the sink, and every non-signal block but the last).
  const jit = new Float64Array(n);
  let w0 = 0;
  let wbg = 0;
  for (let j = 1; j < (Nb - 1) * B; j++) {
    const J = Math.floor(j / B);
    if (isSignal[J]) continue;
    jit[j] = jitter * g();
    if (J === 0) w0 += Math.exp(jit[j]);
    else wbg += Math.exp(jit[j]);
  }
  const lastStart = (Nb - 1) * B;
  const G = signalBlocks.length * B;
  const b = Math.min(B, n);
  // Fit x_sink, x_local, x_signal: proxy row t sees (n - b + t + 1) keys.
  let xs = 1;
  let xl = 1;
  let xg = 1;
  for (let it = 0; it < 500; it++) {
    let ms = 0;
    let ml = 0;
    let mg = 0;
    for (let t = 0; t < b; t++) {
      const seenLocal = n - b + t + 1 - lastStart;
      const Z = xs + w0 + G * xg + wbg + seenLocal * xl;
      ms += (xs + w0) / Z;
      ml += (seenLocal * xl) / Z;
      mg += (G * xg) / Z;
    }
    ms /= b;
    ml /= b;
    mg /= b;
    xs = Math.max(1e-6, (xs + w0) * (spec.sink / ms) - w0);
    xl *= spec.local / ml;
    xg *= spec.signal / mg;
  }
  const q = new Float32Array(n * d);
  const k = new Float32Array(n * d);
  const v = new Float32Array(n * d);
  for (let i = 0; i < n; i++) {
    q.set([1, 1, 1, 1], i * d);
    for (let c = 8; c < d; c++) q[i * d + c] = g();
    for (let c = 0; c < d; c++) v[i * d + c] = g();
  }
  k[0] = Math.log(xs);
  for (let j = 0; j < n; j++) {
    const J = Math.floor(j / B);
    if (J === Nb - 1) k[j * d + 1] = Math.log(xl);
    else if (isSignal[J]) k[j * d + 2] = Math.log(xg);
    else if (j > 0) k[j * d + 3] = jit[j];
    for (let c = 4; c < 8; c++) k[j * d + c] = g();
  }
  const shape = [n, 1, d];
  return {
    q: { dtype: 'f32', shape, data: q },
    k: { dtype: 'f32', shape, data: k },
    v: { dtype: 'f32', shape, data: v },
    d,
  };
}

export type HeadKind = 'sink' | 'local' | 'diffuse';

export interface MixedHeadsSpec {
  readonly n: number;
  /** one entry per head: the kind and, for sink heads, the sink logit margin */
  readonly heads: ReadonlyArray<{ readonly kind: HeadKind; readonly strength?: number }>;
  readonly seed: number;
}

/**
 * H heads with their own kv heads (H = Hkv), d = 16, default scale 1/4:
 *  - 'sink': Gaussian q, k (logit std ≈ 1) plus a sink key 0 whose logit is `strength`
 *    above the rest for every query (channel 0 carries it);
 *  - 'local': RoPE-like rotating features, logits strength · mean_f cos(ω_f (i − j)),
 *    so each query looks at its recent past (a slash head);
 *  - 'diffuse': Gaussian q, k only (logit std ≈ 1): no structure to find.
 */
export function mixedHeads(spec: MixedHeadsSpec): { q: HostTensor; k: HostTensor; v: HostTensor } {
  const { n } = spec;
  const H = spec.heads.length;
  const d = 16;
  const g = gaussian(rng(spec.seed));
  const q = new Float32Array(n * H * d);
  const k = new Float32Array(n * H * d);
  const v = new Float32Array(n * H * d);
  const omega = Array.from({ length: d / 2 }, (_, f) => 10000 ** (-f / (d / 2)));
  for (let h = 0; h < H; h++) {
    const { kind, strength = 8 } = spec.heads[h];
    for (let i = 0; i < n; i++) {
      const o = (i * H + h) * d;
      for (let c = 0; c < d; c++) v[o + c] = g();
      if (kind === 'local') {
        // q·k·(1/4) = strength · (1/8) Σ_f cos(ω_f (i − j))
        const a = (4 * strength) / (d / 2);
        for (let f = 0; f < d / 2; f++) {
          q[o + 2 * f] = a * Math.cos(omega[f] * i);
          q[o + 2 * f + 1] = a * Math.sin(omega[f] * i);
          k[o + 2 * f] = Math.cos(omega[f] * i);
          k[o + 2 * f + 1] = Math.sin(omega[f] * i);
        }
      } else {
        // Gaussian with std 1/sqrt(2) per channel: logit std ≈ sqrt(15) / 2 / 2 ≈ 1 after scale 1/4.
        for (let c = 1; c < d; c++) {
          q[o + c] = g() * Math.SQRT1_2;
          k[o + c] = g() * Math.SQRT1_2;
        }
        if (kind === 'sink') {
          q[o] = 1;
          if (i === 0) k[o] = 4 * strength;
        }
      }
    }
  }
  const shape = [n, H, d];
  return { q: { dtype: 'f32', shape, data: q }, k: { dtype: 'f32', shape, data: k }, v: { dtype: 'f32', shape, data: v } };
}
