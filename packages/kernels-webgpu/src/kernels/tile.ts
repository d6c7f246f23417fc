/**
 * The 64 x 64 score tile every attention-like kernel shares: 256 threads as 16 x 16, each
 * owning a 4 x 4 register block of S = Q Kᵀ (query rows tr*4..tr*4+3, keys tc*4..tc*4+3).
 * Q and K stream through workgroup memory 16 head dims at a time, stored transposed so one
 * vec4 load feeds four FMAs per operand. The caller supplies how a tile row maps to a q row.
 *
 * Shape legend: q [m, H, d], k [n, Hkv, d]; query tile 64 rows, key tile 64 keys.
 */
import { NON_FINITE_WGSL, type StorageDType, vec4ArrayType, widen } from './common.js';

/** Workgroup scratch the tile uses: QK holds the Q chunk [16][16] then the K chunk [16][16]. */
export const TILE_SHARED = `var<workgroup> QK: array<vec4<f32>, 512>;
// set when a loaded q, k or v value is NaN or Inf: the kernel then poisons what it writes
var<workgroup> badInput: atomic<u32>;
${NON_FINITE_WGSL}`;

/**
 * How a proxy-statistics kernel gets its 64 x 64 score tiles (kernels/proxy.ts): the FMA
 * tile below, or the tensor-core one (./proxy-tile-subgroup-matrix.ts). Either way each of
 * the 256 threads (16 x 16) ends a tile holding s0..s3 (vec4<f32>, rows tr*4+i, keys
 * tc*4..+3, in log2 units: scaled by P.scaleLog2), and flags non-finite q or k in badInput.
 * Needs in scope: lid, tr, tc, lr, ld, h, g, and `rt` (the row tile) before `rowTile`,
 * `k0` before `tile`; P.m, P.n, P.H, P.Hkv, P.b, P.scaleLog2.
 */
export interface ScoreTile {
  /** `enable` directives */
  readonly enables: string;
  /** WGSL array types of the Q and K bindings */
  readonly qType: string;
  readonly kType: string;
  /** workgroup variables and helper functions (declares `badInput`) */
  readonly shared: string;
  /** extra entry-point parameters */
  readonly builtins: string;
  /** declarations at the top of the entry point */
  readonly registers: string;
  /**
   * Statements once per key tile `k0`, before its row tiles (uniform control flow; may use
   * barriers). `first`/`next`: WGSL conditions of a loop over key tiles, where the tile
   * may load ahead (`first`: nothing loaded yet; `next`: a tile follows).
   */
  keyTile(o?: { readonly first?: string; readonly next?: string }): string;
  /** statements once per row tile `rt` (uniform control flow; may use barriers) */
  readonly rowTile: string;
  /** statements computing s0..s3 for the key tile at `k0` and row tile `rt` (uniform control flow) */
  readonly tile: string;
  /**
   * Where the tile keeps its scores, when the kernel may reuse that workgroup memory after
   * reading them (vec4 words, `rowVec4` a row): WGSL to read and write one vec4<f32>, and read one f32.
   */
  readonly scratch?: {
    readonly rowVec4: number;
    get4(i: string): string;
    set4(i: string, v: string): string;
    /** one f32: row r, column c (in f32 words) */
    get1(r: string, c: string): string;
  };
  /** tag for program names and cache keys ('' for the FMA tile) */
  readonly tag: string;
}

/** The FMA score tile of a proxy kernel: Q̂ rows P.m - P.b + iL of head h, iL = rt * 64 + lr. */
export function fmaScoreTile(dtype: StorageDType, headDim: number, compact: boolean): ScoreTile {
  return {
    enables: '',
    qType: vec4ArrayType(dtype),
    kType: vec4ArrayType(dtype),
    shared: TILE_SHARED,
    builtins: '',
    registers: '',
    keyTile: () => '',
    rowTile: 'let iL = rt * 64u + lr;',
    tile: scoreTileWgsl({
      dtype,
      headDim,
      qIndex4: (dc) => `(((P.m - P.b + iL) * P.H + h) * D + ${dc} + ld) / 4u`,
      qValid: 'iL < P.b',
      qScale: 'P.scaleLog2',
      compact,
    }),
    tag: '',
  };
}

/**
 * WGSL statements computing s0..s3 (vec4<f32>, rows tr*4+i, keys tc*4..+3) for one key tile.
 * Needs in scope: lid, tr, tc, lr (= lid / 4), ld (= (lid % 4) * 4), and the expressions
 * `qIndex4(dc)`/`qValid` for the loader's row (row lr of the tile), `k0`, `g` (kv head),
 * P.n, P.Hkv; buffers Q and K. Q values are multiplied by `qScale`.
 */
export function scoreTileWgsl(o: {
  dtype: StorageDType;
  headDim: number;
  qIndex4: (dc: string) => string;
  qValid: string;
  qScale: string;
  /** rolled loops: far smaller code for CPU adapters (SwiftShader compiles with LLVM) */
  compact?: boolean;
}): string {
  const D = o.headDim;
  const lq = widen(o.dtype, `Q[${o.qIndex4('dc')}]`);
  const lk = widen(o.dtype, 'K[((kposL * P.Hkv + g) * D + dc + ld) / 4u]');
  const fma: string[] = [];
  if (o.compact) {
    fma.push('for (var kk = 0u; kk < 16u; kk++) { let a = QK[kk * 16u + tr]; let b = QK[256u + kk * 16u + tc];');
    fma.push('  s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }');
  } else {
    for (let kk = 0; kk < 16; kk++) {
      fma.push(`{ let a = QK[${kk * 16}u + tr]; let b = QK[${256 + kk * 16}u + tc];`);
      fma.push('  s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }');
    }
  }
  return `
    var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
    for (var dc = 0u; dc < ${D}u; dc += 16u) {
      var qv = vec4<f32>(0.0);
      if (${o.qValid}) { qv = ${lq} * ${o.qScale}; }
      let kposL = k0 + lr;
      var kv = vec4<f32>(0.0);
      if (kposL < P.n) { kv = ${lk}; }
      if (nonFinite(qv) || nonFinite(kv)) { atomicStore(&badInput, 1u); }
      let qa = ld * 16u + lr / 4u;
      let qc = lr % 4u;
      QK[qa][qc] = qv.x; QK[qa + 16u][qc] = qv.y; QK[qa + 32u][qc] = qv.z; QK[qa + 48u][qc] = qv.w;
      QK[256u + qa][qc] = kv.x; QK[256u + qa + 16u][qc] = kv.y; QK[256u + qa + 32u][qc] = kv.z; QK[256u + qa + 48u][qc] = kv.w;
      workgroupBarrier();
      ${fma.join('\n      ')}
      workgroupBarrier();
    }`;
}
