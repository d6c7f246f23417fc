/**
 * FMA flash attention, version 4: the contract, uniforms, bindings (same buffers; f16 bound
 * as array<vec4<u32>>, eight halves per element) and register blocks of v3, with the
 * staging rebuilt so that no global-memory latency sits between a barrier and the next
 * multiply-adds.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d], lse [H, m] f32;
 * B block size, Nb = ceil(n / B). Query row r sits at absolute position n - m + r.
 *
 * v1 and v3 measured the same on the H200 (17.7 TFLOP/s) although v3 halved the barriers
 * and the workgroup loads per FMA. What both do is load a chunk from global memory, store
 * it, wait at a barrier and only then compute: every chunk (12 per key tile) exposes a full
 * L2 round trip that only other resident workgroups can hide. v4 changes, against v3:
 * - software pipelining: the global loads of chunk c+1 are issued before the FMAs of chunk
 *   c and kept raw in registers (2 x vec4<u32> for f16), widened and stored after them;
 *   only the first Q/K chunk of each key tile is loaded before a barrier;
 * - conflict-free transposed stores: one thread stages one row (16 head dims) of Q or K, so
 *   the 32 lanes of a warp write 32 consecutive words (v3: 4-way bank conflicts);
 * - 16-byte global loads (eight halves) instead of 8-byte ones;
 * - multiply-adds written with the fma() builtin (`muladd` keeps `a * b + c`, whose
 *   contraction into one instruction is up to the driver; the device script compares both).
 * Workgroup memory as v3: P 16 KiB + staging 16 KiB (two buffers of 512 vec4).
 * Online softmax in base 2 (scale·log2 e folded into q), f32 accumulation, causal mask only
 * on the diagonal tile and the ragged last tile. GQA: head h reads kv head floor(h / (H / Hkv)).
 */
import { attentionInterface, type ProgramDescriptor, type StorageDType, narrow , NON_FINITE_WGSL, PACK_U2_WGSL } from './common.js';

/** Workgroup memory the v4 kernel declares (bytes); the backend falls back to v1 below it. */
export const ATTENTION_V4_WORKGROUP_BYTES = 32768;
/** The same for the `wide` form (32-dim Q/K chunks, 32-key V chunks). */
export const ATTENTION_V4_WIDE_WORKGROUP_BYTES = 49152;

export interface AttentionV4Options {
  /** rolled inner loops for CPU adapters (same arithmetic, far less code to compile) */
  readonly compact?: boolean;
  /** `a * b + c` instead of fma(a, b, c) in the inner loops (a device experiment) */
  readonly muladd?: boolean;
  /** load each chunk right before its barrier, as v3 did (a device experiment) */
  readonly noPrefetch?: boolean;
  /**
   * 32 head dims per Q/K chunk and 32 keys per V chunk (two buffers of 16 KiB; 48 KiB of
   * workgroup memory in all): half the barriers and twice the FMAs between them. Needs
   * maxComputeWorkgroupStorageSize >= 49152 (H200-class GPUs; not SwiftShader).
   */
  readonly wide?: boolean;
  /**
   * Robustness-friendly indexing (session 4 experiment): workgroup memory declared as nested
   * arrays, [buffer][part][row][column] and Ps as [key / 16][key % 16][row group], so that in
   * the inner loops every index is either a compile-time constant (no clamp) or the same for
   * the whole chunk (one clamp, hoisted). Tint's robustness transform clamps each dynamic
   * index of a fixed-size array; with flat arrays that is a min() on every load (~5% on the
   * H200: the `+norobust` toggle measured 24.9 against 23.6 TFLOP/s), which browsers cannot
   * turn off.
   */
  readonly idx?: boolean;
  /**
   * Prefetch the next key tile's first Q/K chunk during the last V chunk (into the buffer
   * that chunk freed), so no global load is exposed between barriers within a segment and a
   * key tile needs 13 barriers instead of 14. The buffers' roles alternate between key tiles
   * (`par`). Needs the prefetching form (not `noPrefetch`).
   */
  readonly prefetchFirst?: boolean;
  /**
   * Leaner staging: the softmax scale (scale·log2 e) multiplies the 32 scores of a thread
   * once per key tile instead of every staged Q value (128 multiplies per thread and tile,
   * K threads included), and f16 inputs are checked for NaN/Inf on the raw words with one
   * and + add + or per four words (a carry into bit 15/31 marks an all-ones exponent).
   */
  readonly lean?: boolean;
}

/**
 * The form the backend runs: `idx` + `prefetchFirst`, the fastest measured on the H200 with
 * Dawn's default toggles (session 4, commit 2b94cd2: 24.9 / 25.6 / 26.5 / 26.5 TFLOP/s at
 * 8k / 16k / 32k / 64k, against plain v4's 23.3 at 32k in the same run; conformance at
 * n = 4000 and 65536 passed with it). `attentionV4Program(dtype, D)` without options is the
 * plain v4 kernel.
 */
export const V4_DEFAULT_FORM: AttentionV4Options = Object.freeze({ idx: true, prefetchFirst: true });

const rep = (n: number, f: (i: number) => string, sep = '\n') => Array.from({ length: n }, (_, i) => f(i)).join(sep);
const C = ['x', 'y', 'z', 'w'];

export function attentionV4Program(dtype: StorageDType, headDim: number, o: AttentionV4Options = {}): ProgramDescriptor {
  const D = headDim;
  const NV = D / 64; // O column groups per thread: columns u*64 + tc*4 .. +3
  const D4 = D / 4;
  const CH = o.wide ? 32 : 16; // head dims per Q/K chunk
  const VK = o.wide ? 32 : 16; // keys per V chunk
  const NVC = 64 / VK; // V chunks per key tile
  const BUF = 2 * CH * 16; // vec4 per staging buffer: Q chunk [CH dims][16] then K chunk
  const KOFF = CH * 16;
  const CHUNKS = D / CH; // Q/K chunks per key tile; even, so the last one sits in buffer 1
  const f16 = dtype === 'f16';
  // raw registers holding one prefetched row chunk: f16 CH/8 vec4<u32>, f32 CH/4 vec4<f32>
  const RN = f16 ? CH / 8 : CH / 4;
  const rawT = f16 ? 'vec4<u32>' : 'vec4<f32>';
  if (o.prefetchFirst && o.noPrefetch) throw new Error('attention-v4: prefetchFirst needs the prefetching form');
  const X = Boolean(o.idx);
  const PF = Boolean(o.prefetchFirst);
  const LEAN = Boolean(o.lean);
  const NF = LEAN && f16; // NaN/Inf check on raw f16 words
  // Buffer operand for the staging helpers: a buffer index (0/1) with nested arrays, the
  // flat offset of the buffer otherwise.
  const bufOf = (ix: string) => (X ? ix : `${ix} * ${BUF}u`);
  // Buffer holding Q/K chunk `c` (pf0: shifted by the tile parity).
  const chunkBuf = (c: string) => (PF ? `((${c} + par) % 2u)` : `(${c} % 2u)`);
  const mad = (acc: string, a: string, b: string) => (o.muladd ? `${acc} += ${a} * ${b};` : `${acc} = fma(vec4<f32>(${a}), ${b}, ${acc});`);

  const sBody = (kk: string) => `{
        ${
          X
            ? `let a0 = W[qb][0][${kk}][tr * 2u]; let a1 = W[qb][0][${kk}][tr * 2u + 1u]; let bb = W[qb][1][${kk}][tc];`
            : `let a0 = W[qb + ${kk} * 16u + tr * 2u]; let a1 = W[qb + ${kk} * 16u + tr * 2u + 1u]; let bb = W[qb + ${KOFF}u + ${kk} * 16u + tc];`
        }
        ${rep(8, (i) => mad(`s${i}`, `a${i >> 2}.${C[i & 3]}`, 'bb'), ' ')}
      }`;
  const sFma = o.compact ? `for (var kk = 0u; kk < ${CH}u; kk++) ${sBody('kk')}` : rep(CH, (kk) => sBody(`${kk}u`), '\n      ');
  // idx: key vc + c of Ps is [pj + c / 16][c % 16]; V value row r = c * NV + u of the
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
          ${X ? `let p0 = ${psAt(c, 0)}; let p1 = ${psAt(c, 1)};` : `let p0 = Ps[(vc + ${c}) * 16u + tr * 2u]; let p1 = Ps[(vc + ${c}) * 16u + tr * 2u + 1u];`}
          ${rep(
            NV,
            (u) => `{ let vv = ${X ? vAt(c, u) : `W[vb + ${c} * ${D4}u + ${u * 16}u + tc]`};
            ${rep(8, (i) => mad(`o${i}_${u}`, `p${i >> 2}.${C[i & 3]}`, 'vv'), ' ')} }`,
            '\n          ',
          )}
        }`;
  const pvFma = o.compact ? `for (var c = 0u; c < ${VK}u; c++) ${pvBody('c')}` : rep(VK, (c) => pvBody(`${c}u`), '\n        ');

  // Load Q/K chunk at head dim `dc` into the raw registers: threads 0-63 one Q row each,
  // 64-127 one K row each (warp-uniform branch); rows outside the sequence read as zero.
  const rowLoad = (arr: string, idx: string) =>
    rep(RN, (j) => `ra${j} = ${arr}[(${idx}) / ${f16 ? 8 : 4}u + ${j}u];`, ' ');
  const loadQK = (dc: string, kbase = 'k0') => `{
        ${rep(RN, (j) => `ra${j} = ${rawT}();`, ' ')}
        if (isK) {
          let kp = ${kbase} + srow;
          if (kp < P.n) { ${rowLoad('K', `(kp * P.Hkv + g) * D + ${dc}`)} }
        } else if (qOk) {
          ${rowLoad('Q', `(qRow * P.H + h) * D + ${dc}`)}
        }
      }`;
  // Widen the raw registers to 16 f32 values (Q scaled), flag NaN/Inf, store transposed
  // into buffer `b`: value of head dim e of row srow at W[b + (K ? 256 : 0) + e*16 + srow/4][srow%4].
  const widenRaw = f16
    ? rep(RN, (j) => `let w${2 * j} = vec4<f32>(unpack2x16float(ra${j}.x), unpack2x16float(ra${j}.y)); let w${2 * j + 1} = vec4<f32>(unpack2x16float(ra${j}.z), unpack2x16float(ra${j}.w));`, '\n        ')
    : rep(RN, (j) => `let w${j} = ra${j};`, ' ');
  const rawCheck = (n: number) => rep(n, (j) => `nf = nf | ((ra${j} & vec4<u32>(0x7c007c00u)) + vec4<u32>(0x04000400u));`, ' ');
  const qkStore = (b: string, j: number, e: number) =>
    X ? `W[${b}][kpart][${j * 4 + e}u][scol][cc]` : `W[at + ${(j * 4 + e) * 16}u][cc]`;
  const storeQK = (b: string) =>
    LEAN
      ? `{
        ${NF ? rawCheck(RN) : ''}
        ${widenRaw}
        ${X ? 'let kpart = select(0u, 1u, isK); let scol = srow / 4u;' : `let at = ${b} + select(0u, ${KOFF}u, isK) + srow / 4u;`}
        let cc = srow % 4u;
        ${rep(CH / 4, (j) => `{ let x = w${j}; ${NF ? '' : 'bad = bad | nonFinite(x); '}${rep(4, (e) => `${qkStore(b, j, e)} = x.${C[e]};`, ' ')} }`, '\n        ')}
      }`
      : `{
        ${widenRaw}
        let sc = select(P.scaleLog2, 1.0, isK);
        ${X ? 'let kpart = select(0u, 1u, isK); let scol = srow / 4u;' : `let at = ${b} + select(0u, ${KOFF}u, isK) + srow / 4u;`}
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
          ra${e} = ${rawT}(); if (kp < P.n) { ra${e} = V[((kp * P.Hkv + g) * D) / ${vPer}u + x % ${vGroups}u]; } }`,
          '\n        ',
        )}
      }`;
  // idx: flat vec4 offset f inside a buffer is [f / KOFF][(f / 16) % CH][f % 16].
  const vStoreF16 = (b: string) =>
    X
      ? `let f = (x / ${vGroups}u) * D4 + (x % ${vGroups}u) * 2u; let fr = f / 16u; let fc = f % 16u;
          W[${b}][fr / ${CH}u][fr % ${CH}u][fc] = lo; W[${b}][fr / ${CH}u][fr % ${CH}u][fc + 1u] = hi;`
      : `let at = ${b} + (x / ${vGroups}u) * D4 + (x % ${vGroups}u) * 2u; W[at] = lo; W[at + 1u] = hi;`;
  const storeV = (b: string) =>
    f16
      ? `{${NF ? `\n        ${rawCheck(vLoads)}` : ''}
        ${rep(
          vLoads,
          (e) => `{ let x = lid + ${e * 128}u; let lo = vec4<f32>(unpack2x16float(ra${e}.x), unpack2x16float(ra${e}.y));
          let hi = vec4<f32>(unpack2x16float(ra${e}.z), unpack2x16float(ra${e}.w));
          ${NF ? '' : 'bad = bad | nonFinite(lo) | nonFinite(hi);\n          '}${vStoreF16(b)} }`,
          '\n        ',
        )}
      }`
      : `{
        ${rep(vLoads, (e) => `{ let x = lid + ${e * 128}u; bad = bad | nonFinite(ra${e}); ${X ? `W[${b}][x / ${KOFF}u][(x / 16u) % ${CH}u][x % 16u]` : `W[${b} + x]`} = ra${e}; }`, '\n        ')}
      }`;
  if (vLoads > 8 || RN > 8 || !Number.isInteger(vLoads)) throw new Error('attention-v4: head dim unsupported by the staging layout');
  const RAW = Math.max(RN, vLoads);
  const mask = `let kv4 = vec4<u32>(k0 + tc * 4u) + vec4<u32>(0u, 1u, 2u, 3u);
          let outside = kv4 >= vec4<u32>(P.n);
          ${rep(8, (i) => `s${i} = select(s${i}, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + ${i}u)) | outside);`, '\n          ')}`;
  // Chunk loop: compute chunk ci from buffer ci % 2 while chunk ci + 1 (or V chunk 0) loads.
  const qkLoop = o.noPrefetch
    ? `for (var ci = 0u; ci < ${CHUNKS}u; ci++) {
        if (ci > 0u) {
          ${loadQK(`ci * ${CH}u`)}
          ${storeQK(bufOf('(ci % 2u)'))}
          workgroupBarrier();
        }
        let qb = ${bufOf('(ci % 2u)')};
        ${sFma}
      }
      ${loadV('0u')}`
    : `for (var ci = 0u; ci < ${CHUNKS}u; ci++) {
        if (ci + 1u < ${CHUNKS}u) { ${loadQK(`(ci + 1u) * ${CH}u`)} } else { ${loadV('0u')} }
        let qb = ${bufOf(chunkBuf('ci'))};
        ${sFma}
        if (ci + 1u < ${CHUNKS}u) {
          ${storeQK(bufOf(chunkBuf('(ci + 1u)')))}
          workgroupBarrier();
        }
      }`;
  // V loop: V chunk j sits in buffer (j + 1) % 2; chunk j + 1 loads during chunk j's FMAs.
  // V chunk j sits in buffer (j + 1) % 2 (pf0: shifted by the tile parity).
  const vBuf = (j: string) => (PF ? `((${j} + 1u + par) % 2u)` : `((${j} + 1u) % 2u)`);
  const vHead = `let vc = j * ${VK}u;${X ? ` let pj = j * ${VK / 16}u;` : ''}
        let vb = ${bufOf(vBuf('j'))};`;
  const vLoop = o.noPrefetch
    ? `for (var j = 0u; j < ${NVC}u; j++) {
        ${vHead}
        if (j > 0u) {
          ${loadV('vc')}
          ${storeV('vb')}
          workgroupBarrier();
        }
        ${pvFma}
        workgroupBarrier();
      }`
    : PF
      ? `for (var j = 0u; j < ${NVC}u; j++) {
        ${vHead}
        if (j + 1u < ${NVC}u) { ${loadV(`vc + ${VK}u`)} } else if (kt + 1u < kr.y) { ${loadQK('0u', 'k0 + 64u')} }
        ${pvFma}
        if (j + 1u < ${NVC}u) {
          ${storeV(bufOf('((j + par) % 2u)'))}
          workgroupBarrier();
        } else if (kt + 1u < kr.y) {
          // the next key tile's first Q/K chunk, into the buffer V chunk ${NVC - 2} left
          ${storeQK(bufOf('(par ^ 1u)'))}
          workgroupBarrier();
        }
      }`
      : `for (var j = 0u; j < ${NVC}u; j++) {
        ${vHead}
        if (j + 1u < ${NVC}u) { ${loadV(`vc + ${VK}u`)} }
        ${pvFma}
        if (j + 1u < ${NVC}u) {
          ${storeV(X ? '(j % 2u)' : `(j % 2u) * ${BUF}u`)}
          workgroupBarrier();
        }
      }`;
  const LAST = 2 * BUF - 1;
  // W[LAST] (passes the key-tile range) and any flat vec4 index f < 2 * BUF, in either layout
  const wLast = X ? `W[1][1][${CH - 1}][15]` : `W[${LAST}]`;
  const wFlat = (f: string) => (X ? `W[(${f}) / ${BUF}u][((${f}) / ${KOFF}u) % 2u][((${f}) / 16u) % ${CH}u][(${f}) % 16u]` : `W[${f}]`);
  // Row partials of row tr * 8 + i, slot s (16 per row as 4 vec4), in buffer `pb`:
  // flat (tr * 8 + i) * 4 + s of that buffer.
  const partAt = (pb: string, i: number, slot: string) =>
    X
      ? `W[${pb}][0][tr * 2u + ${i >> 2}u][${(i & 3) * 4}u + ${slot}]`
      : pb === '0u'
        ? `W[(tr * 8u + ${i}u) * 4u + ${slot}]`
        : `W[${pb} * ${BUF}u + (tr * 8u + ${i}u) * 4u + ${slot}]`;
  const PB = PF ? 'par' : '0u'; // buffer of the row-max partials (the second-to-last chunk's)
  const wgsl = /* wgsl */ `
${attentionInterface(f16 ? { q: 'array<vec4<u32>>', k: 'array<vec4<u32>>', v: 'array<vec4<u32>>', o: 'array<vec2<u32>>' } : { q: 'array<vec4<f32>>', k: 'array<vec4<f32>>', v: 'array<vec4<f32>>', o: 'array<vec4<f32>>' })}

const D: u32 = ${D}u;
const D4: u32 = ${D4}u;
const MASKED: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
// P of the current key tile, transposed: [key][row group of 4]${X ? ' as [key / 16][key % 16][row group]' : ''}.
var<workgroup> Ps: ${X ? 'array<array<array<vec4<f32>, 16>, 16>, 4>' : 'array<vec4<f32>, 1024>'};
// Staging, two buffers of ${BUF} vec4: a Q chunk [${CH} dims][64 rows] at +0 and a K chunk at
// +${KOFF}, or a V chunk [${VK} keys][d]. Buffer 0's first 256 also hold the row partials (max
// per tile; at the end sums and the NaN flag); W[${2 * BUF - 1}] passes the key-tile range.${
  X
    ? `
// Nested as [buffer][part: Q or K, halves of a V chunk][row: head dim or V row][16 columns].
var<workgroup> W: array<array<array<array<vec4<f32>, 16>, ${CH}>, 2>, 2>;`
    : `
var<workgroup> W: array<vec4<f32>, ${2 * BUF}>;`
}

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
  // the row this thread stages: Q row q0 + srow (threads 0-63) or K row k0 + srow (64-127)
  let isK = lid >= 64u;
  let srow = lid % 64u;
  let qpos = q0 + srow;
  let qOk = qpos >= rowOff && qpos < P.n;
  let qRow = select(0u, qpos - rowOff, qOk);
  ${rep(RAW, (j) => `var ra${j} = ${rawT}();`, ' ')}
  ${rep(8, (i) => rep(NV, (u) => `var o${i}_${u} = vec4<f32>(0.0);`, ' '), '\n  ')}
  var mlo = vec4<f32>(-1.0e30); var mhi = vec4<f32>(-1.0e30); // running max, rows tr*8 + 0..3 / 4..7
  var llo = vec4<f32>(0.0); var lhi = vec4<f32>(0.0);          // this thread's partial row sums
  var bad = false;${NF ? '\n  var nf = vec4<u32>(0u); // bit 15/31 set: a NaN/Inf half was staged' : ''}${PF ? '\n  var par = 0u; // the buffer holding Q/K chunk 0 of the current key tile' : ''}
  let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    var sgr = vec2<u32>(0u, 1u);
    if (P.dense == 0u) { sgr = vec2<u32>(rowPtr[h * P.Nb + I], rowPtr[h * P.Nb + I + 1u]); }
    ${wLast} = packU2(sgr);
  }
  let sg = unpackU2(workgroupUniformLoad(&${wLast}));
  for (var si = sg.x; si < sg.y; si++) {
    // every thread has finished the previous segment (and read W[${LAST}]) before it is reused
    workgroupBarrier();
    if (lid == 0u) {
      var kr0 = vec2<u32>(0u, t + 1u);
      if (P.dense == 0u) { let J = cols[si]; kr0 = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
      ${wLast} = packU2(kr0);
    }
    let kr = unpackU2(workgroupUniformLoad(&${wLast}));
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      ${
        PF
          ? `// Chunk 0 of this key tile: prefetched during the previous tile's last V chunk,
      // except for the first tile of a segment.
      if (kt == kr.x) {
        ${loadQK('0u')}
        workgroupBarrier();
        ${storeQK(bufOf('par'))}
        workgroupBarrier();
      }`
          : `// Chunk 0 of this key tile: buffer 0 may still hold the last V chunk being read.
      ${loadQK('0u')}
      workgroupBarrier();
      ${storeQK('0u')}
      workgroupBarrier();`
      }
      ${rep(8, (i) => `var s${i} = vec4<f32>(0.0);`, ' ')}
      ${qkLoop}${LEAN ? `
      ${rep(8, (i) => `s${i} *= P.scaleLog2;`, ' ')}` : ''}
      if (kt == t || k0 + 64u > P.n) {
          ${mask}
      }
      // Row maxima: 16 partials per row into buffer ${PF ? 'par' : '0'} (its last chunk was read before the
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
          `${X ? `Ps[tc / 4u][(tc % 4u) * 4u + ${j}u][tr * 2u]` : `Ps[(tc * 4u + ${j}u) * 16u + tr * 2u]`} = vec4<f32>(p0.${C[j]}, p1.${C[j]}, p2.${C[j]}, p3.${C[j]});
      ${X ? `Ps[tc / 4u][(tc % 4u) * 4u + ${j}u][tr * 2u + 1u]` : `Ps[(tc * 4u + ${j}u) * 16u + tr * 2u + 1u]`} = vec4<f32>(p4.${C[j]}, p5.${C[j]}, p6.${C[j]}, p7.${C[j]});`,
        '\n      ',
      )}
      ${rep(8, (i) => rep(NV, (u) => `o${i}_${u} *= ${i < 4 ? 'alo' : 'ahi'}.${C[i & 3]};`, ' '), '\n      ')}
      // V chunk 0 into buffer ${PF ? 'par ^ 1' : '1'} (the last Q/K chunk there was read before the barrier above).
      ${storeV(PF ? bufOf('(par ^ 1u)') : X ? '1u' : `${BUF}u`)}
      // P and V chunk 0 complete; everyone is past reading the partials in buffer ${PF ? 'par' : '0'}.
      workgroupBarrier();
      ${vLoop}${PF ? '\n      par = par ^ 1u;' : ''}
    }
  }
  // Row sums and the NaN/Inf flag through buffer 0.${NF ? '\n  bad = bad | any((nf & vec4<u32>(0x80008000u)) != vec4<u32>(0u));' : ''}
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
  const tag = `${o.compact ? ':compact' : ''}${o.muladd ? ':muladd' : ''}${o.noPrefetch ? ':noprefetch' : ''}${o.wide ? ':wide' : ''}${X ? ':idx' : ''}${PF ? ':pf0' : ''}${LEAN ? ':lean' : ''}`;
  return { name: 'attentionV4', cacheKey: `attentionV4:${dtype}:d${D}${tag}`, wgsl, entryPoint: 'main' };
}
