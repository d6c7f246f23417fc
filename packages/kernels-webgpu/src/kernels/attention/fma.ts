/**
 * FMA flash attention: the kernel the backend runs for every dtype, and for f16 unless the
 * experimental subgroup-matrix kernel is chosen and eligible.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d], lse [H, m] f32;
 * B block size, Nb = ceil(n / B). Query row r sits at absolute position n - m + r.
 * f16 binds as array<vec4<u32>> (eight halves per element), f32 as array<vec4<f32>>.
 *
 * One workgroup of 128 threads (8 x 16) owns a 64-row query tile of one head and walks
 * 64-key tiles (dense: every tile up to the diagonal; sparse: the tiles of the blocks in row
 * (h, I) of rowPtr/cols). Each thread owns an 8 x 4 block of S (rows tr*8.., keys tc*4..)
 * and 8 rows x d/16 columns of O. Staging:
 * - Q/K chunks of 16 head dims and V chunks of 16 keys, double-buffered in workgroup memory;
 * - software pipelining: the global loads of chunk c+1 are issued before the FMAs of chunk
 *   c and kept raw in registers (2 x vec4<u32> for f16), widened and stored after them; the
 *   next key tile's first Q/K chunk loads during the last V chunk (the buffers' roles
 *   alternate between key tiles, `par`), so only a segment's first key tile waits on a load;
 * - conflict-free transposed stores: one thread stages one row (16 head dims) of Q or K, so
 *   the 32 lanes of a warp write 32 consecutive words; 16-byte global loads;
 * - workgroup memory declared as nested arrays (W [buffer][part][row][16 columns], Ps
 *   [key / 16][key % 16][row group]), so every index in the inner loops is a constant or the
 *   same for the whole chunk: Tint's robustness transform clamps each dynamic index of a
 *   fixed-size array, and browsers cannot turn it off;
 * - multiply-adds written with the fma() builtin.
 * Workgroup memory: P 16 KiB + staging 16 KiB (two buffers of 512 vec4).
 * Online softmax in base 2 (scale·log2 e folded into q), f32 accumulation, causal mask only
 * on the diagonal tile and the ragged last tile. NaN/Inf in a staged input poisons the query
 * tile's rows. GQA: head h reads kv head floor(h / (H / Hkv)).
 *
 * On one H200 (Dawn over Vulkan, H = 32, Hkv = 8, d = 128, f16): 25.8 / 26.8 / 27.1 / 26.8
 * TFLOP/s dense at 8k / 16k / 32k / 64k (PERFORMANCE.md).
 */
import {
  attentionInterface,
  type ProgramDescriptor,
  type StorageDType,
  narrow,
  NON_FINITE_WGSL,
  PACK_U2_WGSL,
  VARLEN_ENTRY_WGSL,
} from '../common.js';

/** Workgroup memory the FMA kernel declares (bytes): the least a device must offer. */
export const FMA_ATTENTION_WORKGROUP_BYTES = 32768;

const rep = (n: number, f: (i: number) => string, sep = '\n') => Array.from({ length: n }, (_, i) => f(i)).join(sep);
const C = ['x', 'y', 'z', 'w'];

/**
 * `compact`: rolled inner loops for CPU adapters (same arithmetic, far less code to compile).
 * `varlen`: the ragged-batch form (one dispatch over many sequences packed along the rows):
 * workgroup y takes work entry `firstWork + y` of the sequence table (binding 8, see
 * VARLEN_TABLE_WGSL in ../common.ts), so shapes, row bases and the mask's rows come per
 * sequence; everything else is the same kernel.
 */
export function fmaAttentionProgram(dtype: StorageDType, headDim: number, compact = false, varlen = false): ProgramDescriptor {
  const D = headDim;
  // The sequence's key and query counts, its mask's rows, and packed row indices: uniforms
  // for one sequence, the sequence table's entries in the varlen form.
  const N = varlen ? 'sn' : 'P.n';
  const DENSE = varlen ? 'sd' : 'P.dense';
  const qRowAt = (r: string) => (varlen ? `(qs + ${r})` : r);
  const kRowAt = (r: string) => (varlen ? `(ks + ${r})` : r);
  const rowAt = (i: string) => (varlen ? `rp + h * nbs + ${i}` : `h * P.Nb + ${i}`);
  const colAt = varlen ? 'cb + si' : 'si';
  const NV = D / 64; // O column groups per thread: columns u*64 + tc*4 .. +3
  const D4 = D / 4;
  const CH = 16; // head dims per Q/K chunk
  const VK = 16; // keys per V chunk
  const NVC = 64 / VK; // V chunks per key tile
  const BUF = 2 * CH * 16; // vec4 per staging buffer: Q chunk [CH dims][16] then K chunk
  const KOFF = CH * 16;
  const CHUNKS = D / CH; // Q/K chunks per key tile; even, so the last one sits in buffer 1
  const f16 = dtype === 'f16';
  // raw registers holding one prefetched row chunk: f16 CH/8 vec4<u32>, f32 CH/4 vec4<f32>
  const RN = f16 ? CH / 8 : CH / 4;
  const rawT = f16 ? 'vec4<u32>' : 'vec4<f32>';
  // Buffer holding Q/K chunk `c`: shifted by the key tile's parity.
  const chunkBuf = (c: string) => `((${c} + par) % 2u)`;
  const mad = (acc: string, a: string, b: string) => `${acc} = fma(vec4<f32>(${a}), ${b}, ${acc});`;

  const sBody = (kk: string) => `{
        let a0 = W[qb][0][${kk}][tr * 2u]; let a1 = W[qb][0][${kk}][tr * 2u + 1u]; let bb = W[qb][1][${kk}][tc];
        ${rep(8, (i) => mad(`s${i}`, `a${i >> 2}.${C[i & 3]}`, 'bb'), ' ')}
      }`;
  const sFma = compact ? `for (var kk = 0u; kk < ${CH}u; kk++) ${sBody('kk')}` : rep(CH, (kk) => sBody(`${kk}u`), '\n      ');
  // Key vc + c of Ps is [pj + c / 16][c % 16]; V value row r = c * NV + u of the
  // buffer is [r / CH][r % CH] (constants when c is).
  const psAt = (c: string, half: number) => {
    const lit = /^\d+u$/.test(c) ? Number.parseInt(c, 10) : undefined;
    const hi = lit === undefined ? `pj + ${c} / 16u` : `pj + ${Math.floor(lit / 16)}u`;
    const lo = lit === undefined ? `${c} % 16u` : `${lit % 16}u`;
    return `Ps[${hi}][${lo}][tr * 2u${half ? ' + 1u' : ''}]`;
  };
  const vAt = (c: string, u: number) => {
    const lit = /^\d+u$/.test(c) ? Number.parseInt(c, 10) : undefined;
    if (lit !== undefined) {
      const r = lit * NV + u;
      return `W[vb][${Math.floor(r / CH)}u][${r % CH}u][tc]`;
    }
    return `W[vb][(${c} * ${NV}u + ${u}u) / ${CH}u][(${c} * ${NV}u + ${u}u) % ${CH}u][tc]`;
  };
  const pvBody = (c: string) => `{
          let p0 = ${psAt(c, 0)}; let p1 = ${psAt(c, 1)};
          ${rep(
            NV,
            (u) => `{ let vv = ${vAt(c, u)};
            ${rep(8, (i) => mad(`o${i}_${u}`, `p${i >> 2}.${C[i & 3]}`, 'vv'), ' ')} }`,
            '\n          ',
          )}
        }`;
  const pvFma = compact ? `for (var c = 0u; c < ${VK}u; c++) ${pvBody('c')}` : rep(VK, (c) => pvBody(`${c}u`), '\n        ');

  // Load Q/K chunk at head dim `dc` into the raw registers: threads 0-63 one Q row each,
  // 64-127 one K row each (warp-uniform branch); rows outside the sequence read as zero.
  const rowLoad = (arr: string, idx: string) =>
    rep(RN, (j) => `ra${j} = ${arr}[(${idx}) / ${f16 ? 8 : 4}u + ${j}u];`, ' ');
  const loadQK = (dc: string, kbase = 'k0') => `{
        ${rep(RN, (j) => `ra${j} = ${rawT}();`, ' ')}
        if (isK) {
          let kp = ${kbase} + srow;
          if (kp < ${N}) { ${rowLoad('K', `(${kRowAt('kp')} * P.Hkv + g) * D + ${dc}`)} }
        } else if (qOk) {
          ${rowLoad('Q', `(${qRowAt('qRow')} * P.H + h) * D + ${dc}`)}
        }
      }`;
  // Widen the raw registers to 16 f32 values (Q scaled), flag NaN/Inf, store transposed
  // into buffer `b`: value of head dim e of row srow at W[b + (K ? 256 : 0) + e*16 + srow/4][srow%4].
  const widenRaw = f16
    ? rep(RN, (j) => `let w${2 * j} = vec4<f32>(unpack2x16float(ra${j}.x), unpack2x16float(ra${j}.y)); let w${2 * j + 1} = vec4<f32>(unpack2x16float(ra${j}.z), unpack2x16float(ra${j}.w));`, '\n        ')
    : rep(RN, (j) => `let w${j} = ra${j};`, ' ');
  const qkStore = (b: string, j: number, e: number) => `W[${b}][kpart][${j * 4 + e}u][scol][cc]`;
  const storeQK = (b: string) => `{
        ${widenRaw}
        let sc = select(P.scaleLog2, 1.0, isK);
        let kpart = select(0u, 1u, isK); let scol = srow / 4u;
        let cc = srow % 4u;
        ${rep(CH / 4, (j) => `{ let x = w${j} * sc; bad = bad | nonFinite(x); ${rep(4, (e) => `${qkStore(b, j, e)} = x.${C[e]};`, ' ')} }`, '\n        ')}
      }`;
  // V chunk `vc0` (16 keys, all d dims, row-major [key][d/4]): f16 two loads of eight halves
  // per thread, f32 four loads of four floats.
  const vPer = f16 ? 8 : 4; // values per raw load
  const vLoads = (VK * D) / vPer / 128; // raw loads per thread (f16 2, f32 4 at d = 128, narrow)
  const vGroups = D / vPer; // raw groups per key
  const loadV = (vc0: string) => `{
        ${rep(
          vLoads,
          (e) => `{ let x = lid + ${e * 128}u; let kp = k0 + ${vc0} + x / ${vGroups}u;
          ra${e} = ${rawT}(); if (kp < ${N}) { ra${e} = V[((${kRowAt('kp')} * P.Hkv + g) * D) / ${vPer}u + x % ${vGroups}u]; } }`,
          '\n        ',
        )}
      }`;
  // Flat vec4 offset f inside a buffer is [f / KOFF][(f / 16) % CH][f % 16].
  const vStoreF16 = (b: string) => `let f = (x / ${vGroups}u) * D4 + (x % ${vGroups}u) * 2u; let fr = f / 16u; let fc = f % 16u;
          W[${b}][fr / ${CH}u][fr % ${CH}u][fc] = lo; W[${b}][fr / ${CH}u][fr % ${CH}u][fc + 1u] = hi;`;
  const storeV = (b: string) =>
    f16
      ? `{
        ${rep(
          vLoads,
          (e) => `{ let x = lid + ${e * 128}u; let lo = vec4<f32>(unpack2x16float(ra${e}.x), unpack2x16float(ra${e}.y));
          let hi = vec4<f32>(unpack2x16float(ra${e}.z), unpack2x16float(ra${e}.w));
          bad = bad | nonFinite(lo) | nonFinite(hi);
          ${vStoreF16(b)} }`,
          '\n        ',
        )}
      }`
      : `{
        ${rep(vLoads, (e) => `{ let x = lid + ${e * 128}u; bad = bad | nonFinite(ra${e}); W[${b}][x / ${KOFF}u][(x / 16u) % ${CH}u][x % 16u] = ra${e}; }`, '\n        ')}
      }`;
  if (vLoads > 8 || RN > 8 || !Number.isInteger(vLoads)) throw new Error('fma attention: head dim unsupported by the staging layout');
  const RAW = Math.max(RN, vLoads);
  const mask = `let kv4 = vec4<u32>(k0 + tc * 4u) + vec4<u32>(0u, 1u, 2u, 3u);
          let outside = kv4 >= vec4<u32>(${N});
          ${rep(8, (i) => `s${i} = select(s${i}, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + ${i}u)) | outside);`, '\n          ')}`;
  // Chunk loop: compute chunk ci from buffer ci % 2 while chunk ci + 1 (or V chunk 0) loads.
  const qkLoop = `for (var ci = 0u; ci < ${CHUNKS}u; ci++) {
        if (ci + 1u < ${CHUNKS}u) { ${loadQK(`(ci + 1u) * ${CH}u`)} } else { ${loadV('0u')} }
        let qb = ${chunkBuf('ci')};
        ${sFma}
        if (ci + 1u < ${CHUNKS}u) {
          ${storeQK(chunkBuf('(ci + 1u)'))}
          workgroupBarrier();
        }
      }`;
  // V loop: V chunk j sits in buffer (j + 1 + par) % 2; chunk j + 1 loads during chunk j's
  // FMAs, and during the last one the next key tile's first Q/K chunk.
  const vBuf = (j: string) => `((${j} + 1u + par) % 2u)`;
  const vHead = `let vc = j * ${VK}u; let pj = j * ${VK / 16}u;
        let vb = ${vBuf('j')};`;
  const vLoop = `for (var j = 0u; j < ${NVC}u; j++) {
        ${vHead}
        if (j + 1u < ${NVC}u) { ${loadV(`vc + ${VK}u`)} } else if (kt + 1u < kr.y) { ${loadQK('0u', 'k0 + 64u')} }
        ${pvFma}
        if (j + 1u < ${NVC}u) {
          ${storeV('((j + par) % 2u)')}
          workgroupBarrier();
        } else if (kt + 1u < kr.y) {
          // the next key tile's first Q/K chunk, into the buffer V chunk ${NVC - 2} left
          ${storeQK('(par ^ 1u)')}
          workgroupBarrier();
        }
      }`;
  // The last vec4 of W (passes the key-tile range), and any flat vec4 index f < 2 * BUF
  const wLast = `W[1][1][${CH - 1}][15]`;
  const wFlat = (f: string) => `W[(${f}) / ${BUF}u][((${f}) / ${KOFF}u) % 2u][((${f}) / 16u) % ${CH}u][(${f}) % 16u]`;
  // Row partials of row tr * 8 + i, slot s (16 per row as 4 vec4), in buffer `pb`:
  // flat (tr * 8 + i) * 4 + s of that buffer.
  const partAt = (pb: string, i: number, slot: string) => `W[${pb}][0][tr * 2u + ${i >> 2}u][${(i & 3) * 4}u + ${slot}]`;
  const PB = 'par'; // buffer of the row-max partials (the second-to-last chunk's)
  const wgsl = /* wgsl */ `
${attentionInterface(f16 ? { q: 'array<vec4<u32>>', k: 'array<vec4<u32>>', v: 'array<vec4<u32>>', o: 'array<vec2<u32>>' } : { q: 'array<vec4<f32>>', k: 'array<vec4<f32>>', v: 'array<vec4<f32>>', o: 'array<vec4<f32>>' }, varlen)}

const D: u32 = ${D}u;
const D4: u32 = ${D4}u;
const MASKED: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
// P of the current key tile, transposed: [key][row group of 4] as [key / 16][key % 16][row group].
var<workgroup> Ps: array<array<array<vec4<f32>, 16>, 16>, 4>;
// Staging, two buffers of ${BUF} vec4: a Q chunk [${CH} dims][64 rows] at +0 and a K chunk at
// +${KOFF}, or a V chunk [${VK} keys][d]. Buffer 0's first 256 also hold the row partials (max
// per tile; at the end sums and the NaN flag); W[${2 * BUF - 1}] passes the key-tile range.
// Nested as [buffer][part: Q or K, halves of a V chunk][row: head dim or V row][16 columns].
var<workgroup> W: array<array<array<array<vec4<f32>, 16>, ${CH}>, 2>, 2>;

${NON_FINITE_WGSL}

${PACK_U2_WGSL}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  let h = ${varlen ? 'P.headBase + wid.x' : 'HT[P.headBase + wid.x]'};
  let g = h / (P.H / P.Hkv);
  // Heads fastest, heaviest tiles (most keys) first: every head's long tiles start in the
  // first wave, so the tail holds only short ones (and a kv group's heads share K/V in L2).
  ${varlen ? VARLEN_ENTRY_WGSL : 'let t = P.firstTile + P.numTiles - 1u - wid.y;'}
  let q0 = t * 64u;
  let rowOff = ${varlen ? 'sn - sm' : 'P.n - P.m'};
  // the row this thread stages: Q row q0 + srow (threads 0-63) or K row k0 + srow (64-127)
  let isK = lid >= 64u;
  let srow = lid % 64u;
  let qpos = q0 + srow;
  let qOk = qpos >= rowOff && qpos < ${N};
  let qRow = select(0u, qpos - rowOff, qOk);
  ${rep(RAW, (j) => `var ra${j} = ${rawT}();`, ' ')}
  ${rep(8, (i) => rep(NV, (u) => `var o${i}_${u} = vec4<f32>(0.0);`, ' '), '\n  ')}
  var mlo = vec4<f32>(-1.0e30); var mhi = vec4<f32>(-1.0e30); // running max, rows tr*8 + 0..3 / 4..7
  var llo = vec4<f32>(0.0); var lhi = vec4<f32>(0.0);          // this thread's partial row sums
  var bad = false;
  var par = 0u; // the buffer holding Q/K chunk 0 of the current key tile
  let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    var sgr = vec2<u32>(0u, 1u);
    if (${DENSE} == 0u) { sgr = vec2<u32>(rowPtr[${rowAt('I')}], rowPtr[${rowAt('I + 1u')}]); }
    ${wLast} = packU2(sgr);
  }
  let sg = unpackU2(workgroupUniformLoad(&${wLast}));
  for (var si = sg.x; si < sg.y; si++) {
    // every thread has finished the previous segment (and read W[${2 * BUF - 1}]) before it is reused
    workgroupBarrier();
    if (lid == 0u) {
      var kr0 = vec2<u32>(0u, t + 1u);
      if (${DENSE} == 0u) { let J = cols[${colAt}]; kr0 = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
      ${wLast} = packU2(kr0);
    }
    let kr = unpackU2(workgroupUniformLoad(&${wLast}));
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      // Chunk 0 of this key tile: prefetched during the previous tile's last V chunk,
      // except for the first tile of a segment.
      if (kt == kr.x) {
        ${loadQK('0u')}
        workgroupBarrier();
        ${storeQK('par')}
        workgroupBarrier();
      }
      ${rep(8, (i) => `var s${i} = vec4<f32>(0.0);`, ' ')}
      ${qkLoop}
      if (kt == t || k0 + 64u > ${N}) {
          ${mask}
      }
      // Row maxima: 16 partials per row into buffer par (its last chunk was read before the
      // barrier that published the last chunk).
      ${rep(8, (i) => `${partAt(PB, i, 'tc / 4u')}[tc % 4u] = max(max(s${i}.x, s${i}.y), max(s${i}.z, s${i}.w));`, '\n      ')}
      workgroupBarrier();
      var tlo = mlo;
      var thi = mhi;
      for (var c = 0u; c < 4u; c++) {
        ${rep(
          8,
          (i) => `{ let r = ${partAt(PB, i, 'c')}; ${i < 4 ? 'tlo' : 'thi'}.${C[i & 3]} = max(${i < 4 ? 'tlo' : 'thi'}.${C[i & 3]}, max(max(r.x, r.y), max(r.z, r.w))); }`,
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
          `Ps[tc / 4u][(tc % 4u) * 4u + ${j}u][tr * 2u] = vec4<f32>(p0.${C[j]}, p1.${C[j]}, p2.${C[j]}, p3.${C[j]});
      Ps[tc / 4u][(tc % 4u) * 4u + ${j}u][tr * 2u + 1u] = vec4<f32>(p4.${C[j]}, p5.${C[j]}, p6.${C[j]}, p7.${C[j]});`,
        '\n      ',
      )}
      ${rep(8, (i) => rep(NV, (u) => `o${i}_${u} *= ${i < 4 ? 'alo' : 'ahi'}.${C[i & 3]};`, ' '), '\n      ')}
      // V chunk 0 into buffer par ^ 1 (the last Q/K chunk there was read before the barrier above).
      ${storeV('(par ^ 1u)')}
      // P and V chunk 0 complete; everyone is past reading the partials in buffer par.
      workgroupBarrier();
      ${vLoop}
      par = par ^ 1u;
    }
  }
  // Row sums and the NaN/Inf flag through buffer 0.
  workgroupBarrier();
  ${rep(8, (i) => `${partAt('0u', i, 'tc / 4u')}[tc % 4u] = ${i < 4 ? 'llo' : 'lhi'}.${C[i & 3]};`, '\n  ')}
  ${wFlat('256u + lid / 4u')}[lid % 4u] = select(0.0, 1.0, bad);
  workgroupBarrier();
  var anyBad = 0.0;
  for (var c = 0u; c < 32u; c++) { anyBad = max(anyBad, dot(${wFlat('256u + c')}, vec4<f32>(1.0))); }
  // NaN/Inf in the inputs must not come out as a finite answer: poison this tile's rows.
  let poisoned = anyBad > 0.0;
  let poison = bitcast<f32>(select(0u, 0x7fc00000u, poisoned));
  llo = vec4<f32>(0.0);
  lhi = vec4<f32>(0.0);
  for (var c = 0u; c < 4u; c++) {
    ${rep(8, (i) => `{ let r = ${partAt('0u', i, 'c')}; ${i < 4 ? 'llo' : 'lhi'}.${C[i & 3]} += dot(r, vec4<f32>(1.0)); }`, '\n    ')}
  }
  ${rep(
    8,
    (i) => `{
    let pos = q0 + tr * 8u + ${i}u;
    let L = ${i < 4 ? 'llo' : 'lhi'}.${C[i & 3]};
    if (pos >= rowOff && pos < ${N}) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((${qRowAt('row')} * P.H + h) * D) / 4u;
      ${rep(NV, (u) => `O[obase + ${u * 16}u + tc] = ${narrow(dtype, `o${i}_${u} * inv`)};`, ' ')}
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + ${qRowAt('row')}] = select(0xff800000u, bitcast<u32>((${i < 4 ? 'mlo' : 'mhi'}.${C[i & 3]} + log2(L)) * LN2), L > 0.0);
      }
    }
  }`,
    '\n  ',
  )}
}
`;
  return {
    name: varlen ? 'attentionFmaVarlen' : 'attentionFma',
    cacheKey: `attentionFma:${dtype}:d${D}${compact ? ':compact' : ''}${varlen ? ':varlen' : ''}`,
    wgsl,
    entryPoint: 'main',
  };
}
