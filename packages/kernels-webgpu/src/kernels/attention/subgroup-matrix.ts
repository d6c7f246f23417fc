/**
 * Tensor-core attention through `chromium-experimental-subgroup-matrix` (f16 in, f32
 * accumulate), for adapters that offer the 16 x 16 x 16 f16 -> f32 configuration with
 * 32-wide subgroups (NVIDIA through Dawn's Vulkan backend).
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d] f16, lse [H, m];
 * B block size, Nb = ceil(n / B). Query row r sits at absolute position n - m + r.
 *
 * One pass with an online softmax. A subgroup-matrix result is opaque (no per-row access),
 * so the O accumulator cannot be rescaled in registers whenever a row's max grows. Each row
 * keeps a reference max instead, and P = 2^(s - ref) is formed against it; the reference
 * moves only when a row's max exceeds it by more than 8 (base 2), so P stays at most 256
 * (exact in f16 to its usual relative precision, and the f32 sums cannot overflow). When
 * any row of the workgroup moves, O goes through workgroup memory once, is scaled by row,
 * and is loaded back: with a sink or a strong early key this happens on the first tile or
 * two of a row and then never. The final 1/L uses the same references, so the result is the
 * exact softmax.
 *
 * Workgroup: 4 subgroups of 32, each owning 16 of the tile's 64 query rows (Q fragments
 * held in registers); key tiles of 64. Per tile and subgroup: S = Q Kᵀ in four 16 x 16
 * result fragments, stored to workgroup memory (f32, row stride 72 words: conflict-free
 * fragment stores); each row is read by two lanes, 32 scores each, as vec4 loads in an order
 * rotated by lane so that no two lanes of a quarter-warp share a bank; the row max combines
 * across the pair by a shuffle; P is packed to f16 pairs and written as vec4 words (stride
 * 72 halves); then O += P V with P loaded as four left fragments. Forms:
 * - `'direct'`: K and V fragments load straight from storage (the four subgroups of a
 *   workgroup read the same fragments, through the cache); two barriers a tile.
 * - `'staged'`: the K tile, then the V tile, are copied into workgroup memory (each lane
 *   issues all its 16-byte loads before its stores; row stride d + 8 halves) and every
 *   subgroup loads its fragments there; V's loads go out before S = Q Kᵀ and are stored
 *   after it, so their latency passes under the products. Four barriers a tile, 44 KiB of
 *   workgroup memory at d = 128.
 * - `'pipelined'`: as staged, and the next K tile of the same mask block is loaded into
 *   registers during the softmax and P V of this one (the first tile of a block loads at
 *   its start).
 * Keys past n (the last, partial tile) are masked to P = 0; in the direct form their K/V
 * loads are clamped into the binding by WebGPU's robust access, so they stay finite, and
 * the staged form writes zeros.
 *
 * The first form, two passes with normalised P, is in subgroup-matrix-two-pass.ts.
 */
import { attentionInterface, type ProgramDescriptor } from '../common.js';
import { SGM_FRAME_ENTRY, SGM_FRAME_VARS, sgmFrameSegments, sgmFrameTiles } from './subgroup-matrix-frame.js';
import { twoPassAttentionProgram, twoPassWorkgroupBytes } from './subgroup-matrix-two-pass.js';

/** The tensor-core kernel's forms; `'pipelined'` is the default (see PERFORMANCE.md). */
export type SubgroupMatrixForm = 'staged' | 'pipelined' | 'direct' | 'two-pass';
export const SUBGROUP_MATRIX_FORMS: readonly SubgroupMatrixForm[] = ['staged', 'pipelined', 'direct', 'two-pass'];
export const DEFAULT_SUBGROUP_MATRIX_FORM: SubgroupMatrixForm = 'pipelined';

/** Row strides in workgroup memory: S in f32 words, P in halves (multiples of 16 bytes). */
const SST = 72;
const PST = 72;
/** The reference max moves only when a row's max exceeds it by more than this (base 2). */
const RESCALE_SLACK = 8;

/** Whether a form copies its K and V tiles into workgroup memory. */
function stagesKv(form: SubgroupMatrixForm): boolean {
  return form === 'staged' || form === 'pipelined';
}

/** Workgroup memory a form needs at head dim `headDim`, in bytes. */
export function subgroupMatrixWorkgroupBytes(form: SubgroupMatrixForm, headDim: number): number {
  if (form === 'two-pass') return twoPassWorkgroupBytes(headDim);
  const s = 4 * 16 * SST * 4;
  const p = 4 * 16 * PST * 2;
  const kv = stagesKv(form) ? 64 * (headDim + 8) * 2 : 0;
  return s + p + kv + 32; // + the flags and ranges
}

/** The largest workgroup memory of any form at d = 128 (the eligibility floor of the kernel). */
export const SUBGROUP_MATRIX_WORKGROUP_BYTES = subgroupMatrixWorkgroupBytes('staged', 128);

/** Head dims the tensor-core kernel is built for (others run the FMA kernel). */
export function subgroupMatrixHeadDim(headDim: number): boolean {
  return headDim === 64 || headDim === 128;
}

/**
 * Parts of the one-pass kernel that a timing-only build leaves out, to see what each costs:
 * `stage` the K/V copies into workgroup memory (staged form), `softmax` the row max, P and
 * the rescale, `pv` the O += P V products. A build without any of them computes no
 * attention: the GPU rig times such builds beside the real one, nothing else uses them.
 */
export type SubgroupMatrixPart = 'stage' | 'softmax' | 'pv';
export const SUBGROUP_MATRIX_PARTS: readonly SubgroupMatrixPart[] = ['stage', 'softmax', 'pv'];

/** The tensor-core attention program for head dim `headDim` (f16 only; 64 or 128). */
export function subgroupMatrixAttentionProgram(
  headDim: number,
  form: SubgroupMatrixForm = DEFAULT_SUBGROUP_MATRIX_FORM,
  without: readonly SubgroupMatrixPart[] = [],
): ProgramDescriptor {
  if (form === 'two-pass') {
    if (without.length) throw new RangeError('the two-pass form has no timing-only builds');
    return twoPassAttentionProgram(headDim);
  }
  if (!subgroupMatrixHeadDim(headDim)) throw new RangeError(`subgroup-matrix attention is built for head dims 64 and 128; got ${headDim}`);
  const D = headDim;
  const D8 = D / 8; // vec4<u32> words per row of K or V
  const KF = D / 16; // k-steps of Q Kᵀ over the head dim, and O fragments
  const staged = stagesKv(form);
  const pipelined = form === 'pipelined';
  const KST = D8 + 1; // staged row stride in vec4 words (d + 8 halves)
  const PW = PST / 8; // P row stride in vec4 words
  const SW = SST / 4; // S row stride in vec4 words

  // K fragment (right operand [16 dims][16 keys], column = key) and V fragment (right
  // operand [16 keys][16 dims], row = key), in vec4<u32> units (8 halves).
  const kFrag = (nf: number, kk: number) =>
    staged
      ? `subgroupMatrixLoad<RM, col_major>(&KVs, ${nf * 16 * KST + kk * 2}u, ${KST}u)`
      : `subgroupMatrixLoad<RM, col_major>(&K, kRow + ${nf * 16}u * kStride + ${kk * 2}u, kStride)`;
  const vFrag = (kc: number, f: number) =>
    staged
      ? `subgroupMatrixLoad<RM, row_major>(&KVs, ${kc * 16 * KST + f * 2}u, ${KST}u)`
      : `subgroupMatrixLoad<RM, row_major>(&V, kRow + ${kc * 16}u * kStride + ${f * 2}u, kStride)`;
  // A K or V tile into workgroup memory: each lane's SPL 16-byte words are all loaded into
  // registers first (independent loads, one memory latency), then stored. (A loop of
  // load-then-store waits out a memory latency per word: measured at 32k on an H100, the
  // kernel without its staging ran in 56 ms against 202 ms with it.) Keys past n load a
  // clamped row and store zeros.
  const SPL = (64 * D8) / 128;
  const fetch = (src: string, into: string, from = 'k0', decl = 'let ') => {
    const out: string[] = [];
    for (let i = 0; i < SPL; i++) {
      out.push(`${decl}${into}${i} = ${src}[(min(${from} + ${(i * 128) / D8}u + lid / ${D8}u, P.n - 1u) * P.Hkv + g) * ${D8}u + lid % ${D8}u];`);
    }
    return out.join('\n      ');
  };
  const put = (from: string) => {
    const out: string[] = [];
    for (let i = 0; i < SPL; i++) {
      out.push(`KVs[(${(i * 128) / D8}u + lid / ${D8}u) * ${KST}u + lid % ${D8}u] = select(vec4<u32>(), ${from}${i}, k0 + ${(i * 128) / D8}u + lid / ${D8}u < P.n);`);
    }
    return out.join('\n      ');
  };

  const qLoads: string[] = [];
  const oDecl: string[] = [];
  for (let kk = 0; kk < KF; kk++) {
    qLoads.push(`let qf${kk} = subgroupMatrixLoad<LM, row_major>(&Q, qBase + ${kk * 16}u, P.H * D);`);
    oDecl.push(`var o${kk} = AM();`);
  }
  // S = Q Kᵀ: four accumulators (one per 16 keys) advanced together over the head dim, so
  // consecutive products do not wait on each other's result
  const sSteps: string[] = ['var s0 = AM();', 'var s1 = AM();', 'var s2 = AM();', 'var s3 = AM();'];
  for (let kk = 0; kk < KF; kk++) for (let nf = 0; nf < 4; nf++) sSteps.push(`s${nf} = subgroupMatrixMultiplyAccumulate(qf${kk}, ${kFrag(nf, kk)}, s${nf});`);
  for (let nf = 0; nf < 4; nf++) sSteps.push(`subgroupMatrixStore<row_major>(&Ssh, sBase + ${nf * 4}u, s${nf}, ${SW}u);`);
  const pvSteps: string[] = [];
  for (let kc = 0; kc < 4; kc++) {
    const fs: string[] = [];
    for (let f = 0; f < KF; f++) fs.push(`o${f} = subgroupMatrixMultiplyAccumulate(pf, ${vFrag(kc, f)}, o${f});`);
    pvSteps.push(`{
        let pf = subgroupMatrixLoad<LM, row_major>(&Psh, pBase + ${kc * 2}u, ${PW}u);
        ${fs.join('\n        ')}
      }`);
  }
  // O in groups of four fragments (64 columns) through this subgroup's S rows: store,
  // barrier, `rowOp` on this lane's 32 values (vec4 j of the row half, as `ov`), barrier.
  const throughS = (rowOp: string, reload: boolean) => {
    const out: string[] = [];
    for (let hf = 0; hf * 4 < KF; hf++) {
      const st: string[] = [];
      const ld: string[] = [];
      for (let f = 0; f < 4; f++) {
        st.push(`subgroupMatrixStore<row_major>(&Ssh, sBase + ${f * 4}u, o${hf * 4 + f}, ${SW}u);`);
        ld.push(`o${hf * 4 + f} = subgroupMatrixLoad<AM, row_major>(&Ssh, sBase + ${f * 4}u, ${SW}u);`);
      }
      out.push(`${st.join('\n    ')}
    workgroupBarrier();
    for (var j = 0u; j < 8u; j++) {
      let jj = (j + hc) & 7u;
      let at = rowS + jj;
      let col = ${hf * 64}u + hc * 32u + 4u * jj;
      var ov = Ssh[at];
      ${rowOp}
    }
    workgroupBarrier();${reload ? `\n    ${ld.join('\n    ')}\n    workgroupBarrier();` : ''}`);
    }
    return out.join('\n    ');
  };

  const softmaxPart = `      // this lane's 32 scores: row r, keys k0 + 32 hc + 4 jj + e, vec4 jj in rotated order
      let lim = min(pos, P.n - 1u);
      var tmx = -1.0e30;
      for (var j = 0u; j < 8u; j++) {
        let jj = (j + hc) & 7u;
        let s4 = Ssh[rowS + jj] * P.scaleLog2;
        let kp = k0 + hc * 32u + 4u * jj;
        tmx = max(tmx, max(max(select(-1.0e30, s4.x, kp <= lim), select(-1.0e30, s4.y, kp + 1u <= lim)),
                           max(select(-1.0e30, s4.z, kp + 2u <= lim), select(-1.0e30, s4.w, kp + 3u <= lim))));
      }
      tmx = max(tmx, subgroupShuffleXor(tmx, 1u));
      var alpha = 1.0;
      if (tmx > mref + ${RESCALE_SLACK}.0) {
        if (mref > -1.0e29) { needWord[parity] = 1u; }
        alpha = exp2(mref - tmx);
        mref = tmx;
      }
      lsum *= alpha;
      // four vec4 of P, each from two vec4 of scores (read in lane-dependent order: no bank conflicts)
      for (var i = 0u; i < 4u; i++) {
        let x = Ssh[rowS + 2u * i + hc];
        let y = Ssh[rowS + 2u * i + 1u - hc];
        let a = select(x, y, hc == 1u);
        let b = select(y, x, hc == 1u);
        let kp = vec4<u32>(k0 + hc * 32u + 8u * i) + vec4<u32>(0u, 1u, 2u, 3u);
        let pa = select(vec4<f32>(), exp2(fma(a, vec4<f32>(P.scaleLog2), vec4<f32>(-mref))), kp <= vec4<u32>(lim));
        let pb = select(vec4<f32>(), exp2(fma(b, vec4<f32>(P.scaleLog2), vec4<f32>(-mref))), kp + vec4<u32>(4u) <= vec4<u32>(lim));
        lsum += (pa.x + pa.y) + (pa.z + pa.w) + (pb.x + pb.y) + (pb.z + pb.w);
        Psh[rowP + i] = vec4<u32>(pack2x16float(pa.xy), pack2x16float(pa.zw), pack2x16float(pb.xy), pack2x16float(pb.zw));
      }
      // P (and a staged V) visible to the subgroup; did any row of the workgroup move its reference?
      if (workgroupUniformLoad(&needWord[parity]) != 0u) {
    ${throughS('Ssh[at] = ov * alpha;', true)}
      }
      if (lid == 0u) { needWord[parity ^ 1u] = 0u; }
      parity ^= 1u;
`;
  // pipelined: the K tile is in registers already, except at a block's first tile
  const kStage = pipelined ? `if (kt == kr.x) {\n        ${fetch('K', 'kp', 'k0', '')}\n      }\n      ${put('kp')}` : `${fetch('K', 'kw')}\n      ${put('kw')}`;
  const kpDecl = pipelined ? Array.from({ length: SPL }, (_, i) => `var kp${i} = vec4<u32>();`).join('\n  ') : '';
  const keep = (part: SubgroupMatrixPart, text: string, instead = '') => (without.includes(part) ? instead : text);
  const tileBody = `
      ${staged ? `${keep('stage', kStage, 'if (P.n == 0u) { KVs[lid] = K[lid] ^ V[lid]; } // (K and V stay bound)')}\n      workgroupBarrier();` : `let kRow = (k0 * P.Hkv + g) * ${D8}u;`}
      ${staged ? `// V's loads go out now; their latency passes under the Q Kᵀ products\n      ${keep('stage', fetch('V', 'vw'))}` : ''}
      ${sSteps.join('\n      ')}
      workgroupBarrier();
      ${staged ? `// every subgroup is past its K fragment loads: V replaces K\n      ${keep('stage', put('vw'))}` : ''}
      ${pipelined ? `// the next K tile of this block, into registers while this tile finishes\n      ${keep('stage', `if (kt + 1u < kr.y) {\n        ${fetch('K', 'kp', 'k0 + 64u', '')}\n      }`)}` : ''}
${keep('softmax', softmaxPart, '      workgroupBarrier();\n')}      ${keep('pv', pvSteps.join('\n      '))}
      ${staged ? '// K of the next tile replaces V only after every subgroup has read it\n      workgroupBarrier();' : ''}`;

  const wgsl = /* wgsl */ `
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
${attentionInterface({ q: 'array<f16>', k: 'array<vec4<u32>>', v: 'array<vec4<u32>>', o: 'array<vec2<u32>>' })}

alias LM = subgroup_matrix_left<f16, 16, 16>;
alias RM = subgroup_matrix_right<f16, 16, 16>;
alias AM = subgroup_matrix_result<f32, 16, 16>;
const D: u32 = ${D}u;
const LN2: f32 = 0.6931471805599453;
var<workgroup> Ssh: array<vec4<f32>, ${(4 * 16 * SST) / 4}>; // per subgroup [16 rows][${SST} words]: S, then O in passing
var<workgroup> Psh: array<vec4<u32>, ${(4 * 16 * PST) / 8}>; // per subgroup [16 rows][${PST} halves]: P as f16
${staged ? `var<workgroup> KVs: array<vec4<u32>, ${64 * KST}>; // the K or V tile [64 keys][d + 8 halves]\n` : ''}var<workgroup> needWord: array<u32, 2>;
${SGM_FRAME_VARS}

${SGM_FRAME_ENTRY}
  let kStride = P.Hkv * ${D8}u;
  let sBase = sg * ${16 * SW}u;               // this subgroup's S rows, vec4 words
  let rowS = sBase + r * ${SW}u + hc * 8u;    // this lane's 8 vec4 of scores
  let pBase = sg * ${16 * PW}u;               // this subgroup's P rows, vec4 words
  let rowP = pBase + r * ${PW}u + hc * 4u;    // this lane's 4 vec4 of P
  ${qLoads.join('\n  ')}
  ${sgmFrameSegments('needWord[0] = 0u;\n    needWord[1] = 0u;')}

  var mref = -1.0e30;  // this row's reference max (base 2, scale folded in)
  var lsum = 0.0;      // this lane's share of the row's normaliser, against mref
  var parity = 0u;
  ${oDecl.join('\n  ')}
  ${kpDecl}
  ${sgmFrameTiles(tileBody)}
  let L = lsum + subgroupShuffleXor(lsum, 1u);
  let invL = select(0.0, 1.0 / L, L > 0.0);
  ${throughS(`if (rowOk) { let ob = ((qRow * P.H + h) * D + col) / 4u; O[ob] = vec2<u32>(pack2x16float(ov.xy * invL), pack2x16float(ov.zw * invL)); }`, false)}
  if (P.returnLse == 1u && rowOk && hc == 0u) {
    LSE[h * P.m + qRow] = select(0xff800000u, bitcast<u32>((mref + log2(L)) * LN2), L > 0.0);
  }
}
`;
  const cut = without.length ? `-without-${[...without].sort().join('-')}` : '';
  return { name: `attentionSubgroupMatrix-${form}${cut}`, cacheKey: `attentionSubgroupMatrix:${form}${cut}:f16:d${D}`, wgsl, entryPoint: 'main' };
}
