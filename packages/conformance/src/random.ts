/**
 * Seeded inputs. Every case derives its own seed from the run's seed and its name, so a
 * failing case reruns alone with the seed printed in its detail.
 */
import { type DType, type HostTensor, hostTensor, mulberry32 } from '@crisp/core';

export type Rng = () => number;

/** mulberry32, from @crisp/core (one generator for every seeded input). */
export const rng: (seed: number) => () => number = mulberry32;

/** A case's seed: the run seed mixed with the case name (FNV-1a). */
export function caseSeed(runSeed: number, name: string): number {
  let h = 0x811c9dc5 ^ (runSeed >>> 0);
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

export function randomSeed(): number {
  return Math.floor(Math.random() * 2 ** 31);
}

export function gaussian(r: Rng): number {
  return Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
}

export interface AttentionInputs {
  readonly q: HostTensor;
  readonly k: HostTensor;
  readonly v: HostTensor;
}

/**
 * q [m, H, d], k and v [n, Hkv, d] with the structure real heads have, so routing and
 * selection see more than noise: a sink (the first keys share a direction the queries lean
 * towards, per kv head with a random strength), a few "vertical" keys with the same
 * direction, and Gaussian noise elsewhere. Never zeros.
 */
export function attentionInputs(
  r: Rng,
  dtype: DType,
  shape: { n: number; m?: number; heads: number; kvHeads: number; headDim: number },
): AttentionInputs {
  const { n, heads: H, kvHeads: Hkv, headDim: d } = shape;
  const m = shape.m ?? n;
  const dir = new Float64Array(Hkv * d);
  for (let i = 0; i < dir.length; i++) dir[i] = gaussian(r);
  for (let g = 0; g < Hkv; g++) {
    let s = 0;
    for (let c = 0; c < d; c++) s += dir[g * d + c] ** 2;
    for (let c = 0; c < d; c++) dir[g * d + c] /= Math.sqrt(s);
  }
  // Per kv head: how strongly queries lean to the sink direction (0: a noise-only head).
  // A sink logit is about lean * boost, so the sink takes from a few % to most of the mass.
  const lean = Array.from({ length: Hkv }, () => (r() < 0.25 ? 0 : 1 + 2 * r()));
  const verticals = new Set<number>(Array.from({ length: Math.max(1, Math.floor(n / 97)) }, () => Math.floor(r() * n)));
  const qv = new Float32Array(m * H * d);
  for (let i = 0; i < m; i++) {
    for (let h = 0; h < H; h++) {
      const g = Math.floor(h / (H / Hkv));
      for (let c = 0; c < d; c++) qv[(i * H + h) * d + c] = gaussian(r) + lean[g] * dir[g * d + c];
    }
  }
  const kv = new Float32Array(n * Hkv * d);
  const vv = new Float32Array(n * Hkv * d);
  for (let j = 0; j < n; j++) {
    const boost = j < 4 ? 3 : verticals.has(j) ? 1.5 : 0;
    for (let g = 0; g < Hkv; g++) {
      for (let c = 0; c < d; c++) {
        kv[(j * Hkv + g) * d + c] = gaussian(r) + boost * dir[g * d + c] * Math.sqrt(d);
        vv[(j * Hkv + g) * d + c] = gaussian(r);
      }
    }
  }
  return {
    q: hostTensor(dtype, [m, H, d], qv),
    k: hostTensor(dtype, [n, Hkv, d], kv),
    v: hostTensor(dtype, [n, Hkv, d], vv),
  };
}
