/**
 * FMA flash attention, version 3: the same contract, uniforms and bindings as
 * attention.ts (v1), reorganised to spend more of each key tile on multiply-adds.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d], lse [H, m] f32;
 * B block size, Nb = ceil(n / B). Query row r sits at absolute position n - m + r.
 *
 * One workgroup of 128 threads (8 x 16) owns a 64-row query tile of one head and walks
 * 64-key tiles exactly as v1 (dense: every tile up to the diagonal; sparse: the tiles of the
 * blocks in row (h, I) of rowPtr/cols). What changed against v1:
 * - each thread owns an 8 x 4 block of S (rows tr*8.., keys tc*4..) and 8 rows x d/16
 *   columns of O: 32 FMAs per 3 vec4 workgroup loads for S, 64 per 4 for P V (v1: 16 per 2,
 *   32 per 3);
 * - Q and K chunks of 16 head dims and V chunks of 16 keys are double-buffered, so each
 *   chunk costs one barrier instead of two: 14 barriers per key tile for d = 128 (v1: ~25);
 * - V is staged without a transpose (one vec4 store per vec4 loaded);
 * - the row-max partials live in the idle half of the double buffer, and the NaN/Inf flag
 *   is a per-thread bit reduced once at the end (no workgroup atomic per load);
 * - 32 KiB of workgroup memory in all (P 16 KiB + the shared staging area 16 KiB), which
 *   fits SwiftShader's limit and leaves room for several workgroups per SM.
 * Online softmax in base 2 (scale·log2 e folded into q), f32 accumulation, the causal mask
 * only on the diagonal tile and the ragged last tile. GQA: head h reads kv head
 * floor(h / (H / Hkv)).
 */
import { attentionInterface, type ProgramDescriptor, type StorageDType, narrow, vec4ArrayType, widen , NON_FINITE_WGSL, PACK_U2_WGSL } from './common.js';

/** Workgroup memory the v3 kernel declares (bytes); the backend falls back to v1 below it. */
export const ATTENTION_V3_WORKGROUP_BYTES = 32768;

const rep = (n: number, f: (i: number) => string, sep = '\n') => Array.from({ length: n }, (_, i) => f(i)).join(sep);
const C = ['x', 'y', 'z', 'w'];

/** `compact`: rolled chunk loops for CPU adapters (same arithmetic, far less code to compile). */
export function attentionV3Program(dtype: StorageDType, headDim: number, compact = false): ProgramDescriptor {
  const D = headDim;
  const NV = D / 64; // O column groups per thread: columns u*64 + tc*4 .. +3
  const D4 = D / 4;
  const CHUNKS = D / 16; // Q/K chunks per key tile; even, so the last one uses buffer 1
  // S += Q_chunk Kᵀ_chunk for the chunk in buffer `b` (a WGSL expression).
  const sBody = (kk: string) => `{
        let a0 = W[qb + ${kk} * 16u + tr * 2u]; let a1 = W[qb + ${kk} * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + ${kk} * 16u + tc];
        ${rep(8, (i) => `s${i} += a${i >> 2}.${C[i & 3]} * bb;`, ' ')}
      }`;
  const sFma = compact ? `for (var kk = 0u; kk < 16u; kk++) ${sBody('kk')}` : rep(16, (kk) => sBody(`${kk}u`), '\n      ');
  // O += P_chunk V_chunk for 16 keys starting at vc, V chunk in buffer vb.
  const pvBody = (c: string) => `{
          let p0 = Ps[(vc + ${c}) * 16u + tr * 2u]; let p1 = Ps[(vc + ${c}) * 16u + tr * 2u + 1u];
          ${rep(
            NV,
            (u) => `{ let vv = W[vb + ${c} * ${D4}u + ${u * 16}u + tc];
            ${rep(8, (i) => `o${i}_${u} += p${i >> 2}.${C[i & 3]} * vv;`, ' ')} }`,
            '\n          ',
          )}
        }`;
  const pvFma = compact ? `for (var c = 0u; c < 16u; c++) ${pvBody('c')}` : rep(16, (c) => pvBody(`${c}u`), '\n        ');
  const lq = widen(dtype, 'Q[((qRow * P.H + h) * D + dc + dg * 4u) / 4u]');
  const lk = widen(dtype, 'K[((kp * P.Hkv + g) * D + dc + dg * 4u) / 4u]');
  const lv = widen(dtype, 'V[((kp * P.Hkv + g) * D) / 4u + x % D4]');
  // Stage Q and K chunk `dc` into buffer `b`: 256 groups of four each, two per thread,
  // transposed to [dim][row] so one vec4 read gives four rows (or keys).
  const stageQK = `{
        let qb2 = (ci % 2u) * 512u;
        for (var e = 0u; e < 2u; e++) {
          let x = lid + e * 128u;
          let row = x / 4u;
          let dg = x % 4u;
          let lpos = q0 + row;
          var qv = vec4<f32>(0.0);
          if (lpos >= rowOff && lpos < P.n) { let qRow = lpos - rowOff; qv = ${lq} * P.scaleLog2; }
          let kp = k0 + row;
          var kv = vec4<f32>(0.0);
          if (kp < P.n) { kv = ${lk}; }
          bad = bad | nonFinite(qv) | nonFinite(kv);
          let at = qb2 + dg * 64u + row / 4u;
          let cc = row % 4u;
          W[at][cc] = qv.x; W[at + 16u][cc] = qv.y; W[at + 32u][cc] = qv.z; W[at + 48u][cc] = qv.w;
          W[at + 256u][cc] = kv.x; W[at + 272u][cc] = kv.y; W[at + 288u][cc] = kv.z; W[at + 304u][cc] = kv.w;
        }
      }`;
  // Stage V keys vc..vc+15 (row-major [key][dim], no transpose) into buffer vb.
  const stageV = `
          for (var x = lid; x < ${16 * D4}u; x += 128u) {
            let kp = k0 + vc + x / D4;
            var vv = vec4<f32>(0.0);
            if (kp < P.n) { vv = ${lv}; }
            bad = bad | nonFinite(vv);
            W[vb + x] = vv;
          }`;
  // Branch-free (select) so the diagonal tile adds no basic blocks: SwiftShader's compiler
  // slows down badly with many small branches in a barrier-split kernel.
  const mask = `let kv4 = vec4<u32>(k0 + tc * 4u) + vec4<u32>(0u, 1u, 2u, 3u);
          let outside = kv4 >= vec4<u32>(P.n);
          ${rep(8, (i) => `s${i} = select(s${i}, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + ${i}u)) | outside);`, '\n          ')}`;
  const wgsl = /* wgsl */ `
${attentionInterface({ q: vec4ArrayType(dtype), k: vec4ArrayType(dtype), v: vec4ArrayType(dtype), o: vec4ArrayType(dtype) })}

const D: u32 = ${D}u;
const D4: u32 = ${D4}u;
const MASKED: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
// P of the current key tile, transposed: [key][row group of 4].
var<workgroup> Ps: array<vec4<f32>, 1024>;
// Staging area, two buffers of 512 vec4: a Q chunk [16 dims][64 rows] at +0 and a K chunk
// at +256, or a V chunk [16 keys][d]. Buffer 0's first 256 also hold the row partials
// (max per tile, sums and the NaN flag at the end) while buffer 1 holds the last Q/K
// chunk; W[1023] passes the key-tile range to every thread.
var<workgroup> W: array<vec4<f32>, 1024>;

${NON_FINITE_WGSL}

${PACK_U2_WGSL}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  let h = P.headBase + wid.x;
  let g = h / (P.H / P.Hkv);
  // Heads fastest, heaviest tiles (most keys) first: every head's long tiles start in the
  // first wave, so the tail holds only short ones (and a kv group's heads share K/V in L2).
  let t = P.firstTile + P.numTiles - 1u - wid.y;
  let q0 = t * 64u;
  let rowOff = P.n - P.m;
  ${rep(8, (i) => rep(NV, (u) => `var o${i}_${u} = vec4<f32>(0.0);`, ' '), '\n  ')}
  var mlo = vec4<f32>(-1.0e30); var mhi = vec4<f32>(-1.0e30); // running max, rows tr*8 + 0..3 / 4..7
  var llo = vec4<f32>(0.0); var lhi = vec4<f32>(0.0);          // this thread's partial row sums
  var bad = false;
  let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    var sgr = vec2<u32>(0u, 1u);
    if (P.dense == 0u) { sgr = vec2<u32>(rowPtr[h * P.Nb + I], rowPtr[h * P.Nb + I + 1u]); }
    W[1023] = packU2(sgr);
  }
  let sg = unpackU2(workgroupUniformLoad(&W[1023]));
  for (var si = sg.x; si < sg.y; si++) {
    // every thread has finished the previous segment (and read W[1023]) before it is reused
    workgroupBarrier();
    if (lid == 0u) {
      var kr0 = vec2<u32>(0u, t + 1u);
      if (P.dense == 0u) { let J = cols[si]; kr0 = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
      W[1023] = packU2(kr0);
    }
    let kr = unpackU2(workgroupUniformLoad(&W[1023]));
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      ${rep(8, (i) => `var s${i} = vec4<f32>(0.0);`, ' ')}
      for (var ci = 0u; ci < ${CHUNKS}u; ci++) {
        let dc = ci * 16u;
        ${stageQK}
        workgroupBarrier();
        let qb = (ci % 2u) * 512u;
        ${sFma}
      }
      if (kt == t || k0 + 64u > P.n) {
          ${mask}
      }
      // Row maxima: 16 partials per row into buffer 0 (idle: the last chunk used buffer 1).
      ${rep(8, (i) => `W[(tr * 8u + ${i}u) * 4u + tc / 4u][tc % 4u] = max(max(s${i}.x, s${i}.y), max(s${i}.z, s${i}.w));`, '\n      ')}
      workgroupBarrier();
      var tlo = mlo;
      var thi = mhi;
      for (var c = 0u; c < 4u; c++) {
        ${rep(
          8,
          (i) => `{ let r = W[(tr * 8u + ${i}u) * 4u + c]; ${i < 4 ? 'tlo' : 'thi'}.${C[i & 3]} = max(${i < 4 ? 'tlo' : 'thi'}.${C[i & 3]}, max(max(r.x, r.y), max(r.z, r.w))); }`,
          '\n        ',
        )}
      }
      let alo = exp2(mlo - tlo);
      let ahi = exp2(mhi - thi);
      mlo = tlo;
      mhi = thi;
      ${rep(8, (i) => `let p${i} = exp2(s${i} - ${i < 4 ? 'tlo' : 'thi'}.${C[i & 3]});`, ' ')}
      let one = vec4<f32>(1.0);
      llo = llo * alo + vec4<f32>(dot(p0, one), dot(p1, one), dot(p2, one), dot(p3, one));
      lhi = lhi * ahi + vec4<f32>(dot(p4, one), dot(p5, one), dot(p6, one), dot(p7, one));
      ${rep(
        4,
        (j) =>
          `Ps[(tc * 4u + ${j}u) * 16u + tr * 2u] = vec4<f32>(p0.${C[j]}, p1.${C[j]}, p2.${C[j]}, p3.${C[j]});
      Ps[(tc * 4u + ${j}u) * 16u + tr * 2u + 1u] = vec4<f32>(p4.${C[j]}, p5.${C[j]}, p6.${C[j]}, p7.${C[j]});`,
        '\n      ',
      )}
      ${rep(8, (i) => rep(NV, (u) => `o${i}_${u} *= ${i < 4 ? 'alo' : 'ahi'}.${C[i & 3]};`, ' '), '\n      ')}
      // P complete, and everyone is past reading the partials in buffer 0.
      workgroupBarrier();
      for (var vc = 0u; vc < 64u; vc += 16u) {
        let vb = ((vc / 16u) % 2u) * 512u;
        ${stageV}
        workgroupBarrier();
        ${pvFma}
      }
    }
  }
  // Row sums and the NaN/Inf flag through buffer 0 (buffer 1 held the last V chunk).
  workgroupBarrier();
  ${rep(8, (i) => `W[(tr * 8u + ${i}u) * 4u + tc / 4u][tc % 4u] = ${i < 4 ? 'llo' : 'lhi'}.${C[i & 3]};`, '\n  ')}
  W[256u + lid / 4u][lid % 4u] = select(0.0, 1.0, bad);
  workgroupBarrier();
  var anyBad = 0.0;
  for (var c = 0u; c < 32u; c++) { anyBad = max(anyBad, dot(W[256u + c], vec4<f32>(1.0))); }
  // NaN/Inf in the inputs must not come out as a finite answer: poison this tile's rows.
  let poisoned = anyBad > 0.0;
  let poison = bitcast<f32>(select(0u, 0x7fc00000u, poisoned));
  llo = vec4<f32>(0.0);
  lhi = vec4<f32>(0.0);
  for (var c = 0u; c < 4u; c++) {
    ${rep(8, (i) => `{ let r = W[(tr * 8u + ${i}u) * 4u + c]; ${i < 4 ? 'llo' : 'lhi'}.${C[i & 3]} += dot(r, vec4<f32>(1.0)); }`, '\n    ')}
  }
  ${rep(
    8,
    (i) => `{
    let pos = q0 + tr * 8u + ${i}u;
    let L = ${i < 4 ? 'llo' : 'lhi'}.${C[i & 3]};
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      ${rep(NV, (u) => `O[obase + ${u * 16}u + tc] = ${narrow(dtype, `o${i}_${u} * inv`)};`, ' ')}
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((${i < 4 ? 'mlo' : 'mhi'}.${C[i & 3]} + log2(L)) * LN2), L > 0.0);
      }
    }
  }`,
    '\n  ',
  )}
}
`;
  return {
    name: 'attentionV3',
    cacheKey: `attentionV3:${dtype}:d${D}${compact ? ':compact' : ''}`,
    wgsl,
    entryPoint: 'main',
  };
}
