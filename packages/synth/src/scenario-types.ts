/** The public shapes of a scenario: options, ground truth, solved strengths, row chunks. */
import type { DType, HostTensor } from '@crisp/core';
import type { HeadKind, ProfileName } from './profiles.js';

export interface ScenarioOptions {
  /** tokens (default 4096) */
  readonly n?: number;
  /** query heads H (default 8) */
  readonly heads?: number;
  /** kv heads Hkv (default 2; H % Hkv == 0) */
  readonly kvHeads?: number;
  /** head dim d (default 64; even, >= 32) */
  readonly headDim?: number;
  /** element type of the generated tensors (default f32) */
  readonly dtype?: DType;
  /** any 32-bit integer (default 1) */
  readonly seed?: number;
  /** slash offsets (tokens) for slash heads; default: drawn per head from [200, min(n/3, 16384)] */
  readonly slashOffsets?: readonly number[];
}

/** One planted retrieval needle: key tokens [position, position + length) of one kv head. */
export interface NeedleTruth {
  readonly id: number;
  readonly kvHead: number;
  readonly position: number;
  readonly length: number;
  /** query heads that read it (the retrieval heads of its kv group) */
  readonly readers: readonly number[];
  /** query rows that attend to it: [start, end) ranges, ascending */
  readonly askers: readonly (readonly [number, number])[];
  /** whether its askers include the last rows (so the proxy map can see it) */
  readonly visibleToProxy: boolean;
}

export interface HeadTruth {
  readonly head: number;
  readonly kvHead: number;
  readonly kind: HeadKind;
  /** the route that serves the head best (EXPECTED_ROUTE): diffuse and sink-topic heads are PE, the rest VS */
  readonly expectedRoute: 'vs' | 'pe';
  /** sink-token mass aimed for at the last query row */
  readonly sinkTarget: number;
  /** slash offsets in tokens (slash heads) */
  readonly slashOffsets: readonly number[];
  /** needle ids this head reads */
  readonly needles: readonly number[];
}

export interface GroundTruth {
  readonly heads: readonly HeadTruth[];
  readonly needles: readonly NeedleTruth[];
  /** vertical-stripe key tokens per kv head */
  readonly stripes: readonly (readonly number[])[];
  /** tokens carrying the attention sink */
  readonly sinkTokens: number;
}

export interface ScenarioChunk {
  /** [end - start, H, d] */
  readonly q: HostTensor;
  /** [end - start, Hkv, d] */
  readonly k: HostTensor;
  /** [end - start, Hkv, d] */
  readonly v: HostTensor;
}

/** The solved per-head logit strengths (nats), for reports and tests. */
export interface HeadStrengths {
  readonly sink: number;
  readonly salience: number;
  readonly local: number;
  readonly slash: readonly { readonly offset: number; readonly amp: number }[];
  readonly stripe: number;
  readonly topic: number;
  /** needle id -> strength */
  readonly needles: ReadonlyMap<number, number>;
}

export interface Scenario {
  readonly profile: ProfileName;
  readonly description: string;
  readonly n: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly dtype: DType;
  readonly seed: number;
  /** the softmax scale the logits were designed for */
  readonly scale: number;
  readonly truth: GroundTruth;
  readonly strengths: readonly HeadStrengths[];
  /** Rows [start, end) of q, k and v as host tensors. Deterministic, chunk-invariant. */
  rows(start: number, end: number): ScenarioChunk;
}
