/**
 * The proxy statistics' score tile on tensor cores (`chromium-experimental-subgroup-matrix`,
 * f16 in, f32 accumulate; the adapters the tensor-core attention runs on, see
 * ./attention/subgroup-matrix.ts). It stands in for the FMA tile of ./tile.ts in the two
 * passes that compute Q̂ Kᵀ over every key (`rowStats`, `scores` in ./proxy.ts); the rest of
 * those kernels is the same WGSL either way.
 *
 * Shape legend: q [m, H, d], k [n, Hkv, d] (f16); 64 proxy rows x 64 keys a tile.
 *
 * Workgroup: 256 threads, 8 subgroups of 32. Subgroup sg owns the 16 x 32 block of rows
 * 16 (sg / 2).. and keys 32 (sg % 2)..: two 16 x 16 result fragments, accumulated over the
 * head dim from its row group's Q fragments (held in registers for the whole row tile) and
 * the K tile's fragments in workgroup memory. The results go to workgroup memory (f32 bits,
 * row stride 72 words), and each thread reads its 4 x 4 block back as four vec4 (a
 * quarter-warp reads 128 consecutive bytes: no bank conflicts).
 *
 * Workgroup memory (35 KiB at d = 128, under the tensor-core attention's 44): the K tile
 * [64 keys][d + 8 halves], each lane's 16-byte loads all issued before its stores (keys
 * past n stored as zeros), and with a `next` condition the following tile's loads go out
 * right after, to land under this tile's products and softmax work (the attention kernel
 * measured staging at 3-4x loading fragments from storage); and one region of u32 words
 * that holds, in turn, the row tile's Q rows (zeros past b, so the fragments never read
 * outside q), the score tile, and whatever the kernel keeps there after its last tile.
 *
 * Non-finite inputs: f16 values are at most 65504, so a finite row and key give
 * |s| <= 128 · 65504² < 2^40, finite in f32; a NaN or ±Inf in a row of q (of the b proxy
 * rows) or a key of k (< n) makes every score it enters NaN or ±Inf (Inf · 0 is NaN, and
 * no finite sum cancels an infinity). So testing the scores of valid rows and keys flags
 * exactly the inputs the FMA tile flags when it loads them.
 */
import { NON_FINITE_WGSL } from './common.js';
import type { ScoreTile } from './tile.js';

/** S row stride in f32 words (as the attention kernel's: conflict-free fragment stores). */
const SST = 72;
/** The score tile's row stride in vec4 words: element (row r, key c) is word c % 4 of vec4 r * this + c / 4. */
export const SGM_SCORE_ROW_VEC4 = SST / 4;

/**
 * The tensor-core score tile for head dim 64 or 128 (f16 storage only). Its `keyTile` loads
 * the K tile at k0 into workgroup memory; `first` and `next` (WGSL conditions) make the loads
 * of the following tile go out early: `first` is true where the registers hold nothing yet.
 */
export function subgroupMatrixScoreTile(headDim: number): ScoreTile {
  if (headDim !== 64 && headDim !== 128) throw new RangeError(`the tensor-core proxy tile is built for head dims 64 and 128; got ${headDim}`);
  const D8 = headDim / 8; // vec4<u32> words (8 halves) per row of q or k
  const KF = headDim / 16; // k-steps over the head dim
  const QST = D8 + 1; // staged Q and K row stride in vec4<u32> words (d + 8 halves)
  const SW = SGM_SCORE_ROW_VEC4;
  const SPL = (64 * D8) / 256; // 16-byte words of a 64-row tile per lane
  const qLoads: string[] = [];
  for (let kk = 0; kk < KF; kk++) qLoads.push(`let qf${kk} = subgroupMatrixLoad<LM, row_major>(&Sw, qFrag + ${kk * 2}u, ${QST}u);`);
  const products: string[] = ['var a0 = AM();', 'var a1 = AM();'];
  for (let kk = 0; kk < KF; kk++) {
    for (let nf = 0; nf < 2; nf++) {
      products.push(`a${nf} = subgroupMatrixMultiplyAccumulate(qf${kk}, subgroupMatrixLoad<RM, col_major>(&Ks, kFrag + ${nf * 16 * QST + kk * 2}u, ${QST}u), a${nf});`);
    }
  }
  const reads: string[] = [];
  for (let i = 0; i < 4; i++) reads.push(`let s${i} = sGet4((tr * 4u + ${i}u) * ${SW}u + tc) * P.scaleLog2;`);
  // the K tile at `from`: each lane's words into registers kw0.., then into Ks
  const row = (i: number) => `${(i * 256) / D8}u + lid / ${D8}u`;
  const fetch = (from: string) =>
    Array.from({ length: SPL }, (_, i) => `kw${i} = K[(min(${from} + ${row(i)}, P.n - 1u) * P.Hkv + g) * ${D8}u + lid % ${D8}u];`).join('\n      ');
  const put = Array.from(
    { length: SPL },
    (_, i) => `Ks[(${row(i)}) * ${QST}u + lid % ${D8}u] = select(vec4<u32>(), kw${i}, k0 + ${row(i)} < P.n);`,
  ).join('\n    ');
  // the row tile's q rows: every load of a lane issued before its stores (zeros past b)
  const qRow = (i: number) => `rt * 64u + ${row(i)}`;
  const qStage = [
    ...Array.from(
      { length: SPL },
      (_, i) => `let qw${i} = select(vec4<u32>(), Q[((P.m - P.b + min(${qRow(i)}, P.b - 1u)) * P.H + h) * ${D8}u + lid % ${D8}u], ${qRow(i)} < P.b);`,
    ),
    ...Array.from({ length: SPL }, (_, i) => `Sw[(${row(i)}) * ${QST}u + lid % ${D8}u] = qw${i};`),
  ].join('\n    ');
  return {
    enables: 'enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;',
    qType: 'array<vec4<u32>>',
    kType: 'array<vec4<u32>>',
    shared: `alias LM = subgroup_matrix_left<f16, 16, 16>;
alias RM = subgroup_matrix_right<f16, 16, 16>;
alias AM = subgroup_matrix_result<f32, 16, 16>;
var<workgroup> Ks: array<vec4<u32>, ${64 * QST}>; // the K tile [64 keys][d + 8 halves]
// the row tile's q rows [64][d + 8 halves], then the score tile [64][${SST}] as f32 bits
var<workgroup> Sw: array<vec4<u32>, ${64 * SW}>;
fn sGet4(i: u32) -> vec4<f32> { return bitcast<vec4<f32>>(Sw[i]); }
fn sSet4(i: u32, v: vec4<f32>) { Sw[i] = bitcast<vec4<u32>>(v); }
// set when a q or k value is NaN or Inf: the kernel then poisons what it writes
var<workgroup> badInput: atomic<u32>;
${NON_FINITE_WGSL}`,
    builtins: ', @builtin(subgroup_id) sgid: u32',
    registers: Array.from({ length: SPL }, (_, i) => `var kw${i} = vec4<u32>();`).join('\n  '),
    keyTile: (o = {}) => {
      const load = o.first ? `if (${o.first}) {\n      ${fetch('k0')}\n    }` : fetch('k0');
      const ahead = o.next ? `\n    // the next K tile's loads, in flight under this tile's work\n    if (${o.next}) {\n      ${fetch('k0 + 64u')}\n    }` : '';
      return `${load}\n    ${put}\n    workgroupBarrier();${ahead}`;
    },
    rowTile: `// the row tile's q rows into Sw (zeros past b), then this subgroup's fragments; Sw's last
    // readers (the previous tile's scores) are past a barrier
    workgroupBarrier();
    ${qStage}
    workgroupBarrier();
    // (fragment offsets must be subgroup-uniform: from subgroup_id, not lid)
    let qFrag = (sgid / 2u) * ${16 * QST}u;
    ${qLoads.join('\n    ')}`,
    tile: `let kFrag = (sgid % 2u) * ${32 * QST}u;
    ${products.join('\n    ')}
    // every subgroup is past its fragment loads (Q, K) and every thread past the previous tile's scores
    workgroupBarrier();
    let sOut = (sgid / 2u) * ${16 * SW}u + (sgid % 2u) * 8u;
    subgroupMatrixStore<row_major>(&Sw, sOut, a0, ${SW}u);
    subgroupMatrixStore<row_major>(&Sw, sOut + 4u, a1, ${SW}u);
    workgroupBarrier();
    ${reads.join('\n    ')}
    {
      let kOk = vec4<u32>(k0 + tc * 4u) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(P.n);
      let r0 = rt * 64u + tr * 4u;
      ${[0, 1, 2, 3].map((i) => `if (r0 + ${i}u < P.b && nonFinite(select(vec4<f32>(), s${i}, kOk))) { atomicStore(&badInput, 1u); }`).join('\n      ')}
    }`,
    scratch: {
      rowVec4: SW,
      get4: (i) => `sGet4(${i})`,
      set4: (i, v) => `sSet4(${i}, ${v})`,
      // a word straight from workgroup memory (a component of a loaded vec4 picked at run
      // time may go through per-thread local memory)
      get1: (r, c) => `bitcast<f32>(Sw[(${r}) * ${SW}u + (${c}) / 4u][(${c}) % 4u])`,
    },
    tag: '-subgroup-matrix',
  };
}
