/**
 * The first tensor-core attention form, `'two-pass'`, kept for measurement beside the
 * single-pass forms of subgroup-matrix.ts (same bindings, same grid).
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d] f16, lse [H, m];
 * B block size, Nb = ceil(n / B). Query row r sits at absolute position n - m + r.
 *
 * A subgroup-matrix result is opaque (no per-element access), so the usual online-softmax
 * rescale of the O accumulator cannot be done in registers. This kernel takes two passes
 * over the same key tiles instead: pass 1 computes S = Q Kᵀ with matrix ops and reduces each
 * row's max M and normaliser L (threads, through workgroup memory); pass 2 recomputes S,
 * writes P = 2^(s - M) / L as f16 and accumulates O += P V in f32 result matrices that are
 * never rescaled. Cost: Q Kᵀ twice (1.5x the matrix work of one pass). Workgroup: 4
 * subgroups of 32, each owning 16 of the tile's 64 query rows; key tiles of 64, staged once
 * per workgroup in workgroup memory (the four subgroups load their fragments from there);
 * block iteration (dense or block-sparse rows) as in the FMA kernel.
 *
 * It matches float64 on the H200 but runs at 6.7-7.3 TFLOP/s there, a quarter of the FMA
 * kernel (PERFORMANCE.md): every score read by the row reductions is a 32-way bank conflict
 * (all lanes read column c of rows 64 words apart), K and V are staged element by element,
 * and S is computed twice.
 */
import { attentionInterface, type ProgramDescriptor } from '../common.js';
import { SGM_FRAME_ENTRY, SGM_FRAME_VARS, sgmFrameSegments, sgmFrameTiles } from './subgroup-matrix-frame.js';

/** Workgroup memory at head dim `headDim` (S 16 KiB, P 8 KiB, the K/V tile, partials): 41 KiB at d = 128. */
export function twoPassWorkgroupBytes(headDim: number): number {
  return 16384 + 8192 + 64 * headDim * 2 + 1024 + 16;
}

/** The two-pass tensor-core attention program for head dim `headDim` (f16 only). */
export function twoPassAttentionProgram(headDim: number): ProgramDescriptor {
  const D = headDim;
  // K or V tile [64 keys][d] into KVs as f16, two halves per u32 word of storage.
  const stage = (src: string) => `
      for (var x = lid; x < ${32 * D}u; x += 128u) {
        let kp = k0 + x / ${D / 2}u;
        var w = 0u;
        if (kp < P.n) { w = ${src}[((kp * P.Hkv + g) * D) / 2u + x % ${D / 2}u]; }
        let hv = bitcast<vec2<f16>>(w);
        KVs[2u * x] = hv.x;
        KVs[2u * x + 1u] = hv.y;
      }`;
  const KF = D / 16; // k-steps over the head dim for Q Kᵀ, and output fragments for P V
  const qLoads: string[] = [];
  const sSteps: string[] = [];
  const oDecl: string[] = [];
  const pvSteps: string[] = [];
  for (let kk = 0; kk < KF; kk++) {
    qLoads.push(
      `let qf${kk} = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + ${kk * 16}u, false, P.H * D);`,
    );
    oDecl.push(`var o${kk} = subgroup_matrix_result<f32, 16, 16>();`);
    pvSteps.push(
      `o${kk} = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + ${kk * 16}u, false, D), o${kk});`,
    );
  }
  for (let nf = 0; nf < 4; nf++) {
    const steps: string[] = [];
    for (let kk = 0; kk < KF; kk++) {
      steps.push(
        `acc = subgroupMatrixMultiplyAccumulate(qf${kk}, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, ${nf * 16 * D + kk * 16}u, true, D), acc);`,
      );
    }
    sSteps.push(`{
        var acc = subgroup_matrix_result<f32, 16, 16>();
        ${steps.join('\n        ')}
        subgroupMatrixStore(&Ssh, sg * 1024u + ${nf * 16}u, acc, false, 64u);
      }`);
  }
  const scoreTile = `${stage('K')}
      workgroupBarrier();
      ${sSteps.join('\n      ')}`;
  const oStore: string[] = [];
  for (let hf = 0; hf * 4 < KF; hf++) {
    const nfr = Math.min(4, KF - hf * 4);
    const st: string[] = [];
    for (let f = 0; f < nfr; f++) {
      st.push(`subgroupMatrixStore(&Ssh, sg * 1024u + ${f * 16}u, o${hf * 4 + f}, false, 64u);`);
    }
    oStore.push(`${st.join('\n  ')}
  workgroupBarrier();
  if (rowOk) {
    let obase = (qRow * P.H + h) * D + ${hf * 64}u;
    for (var c = hc * ${nfr * 8}u; c < hc * ${nfr * 8}u + ${nfr * 8}u; c++) {
      O[obase + c] = f16(Ssh[sg * 1024u + r * 64u + c] * poisonScale);
    }
  }
  workgroupBarrier();`);
  }
  const wgsl = /* wgsl */ `
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
${attentionInterface({ q: 'array<f16>', k: 'array<u32>', v: 'array<u32>', o: 'array<f16>' })}

const D: u32 = ${D}u;
const LN2: f32 = 0.6931471805599453;
var<workgroup> Ssh: array<f32, 4096>;  // per subgroup [16 rows][64 keys] scores, then O staging
var<workgroup> Psh: array<f16, 4096>;  // per subgroup [16 rows][64 keys] probabilities
var<workgroup> KVs: array<f16, ${64 * D}>; // the K or V tile [64 keys][d]
var<workgroup> parts: array<vec2<f32>, 128>; // per (row, half): (max, sum) partials
${SGM_FRAME_VARS}

${SGM_FRAME_ENTRY}
  ${qLoads.join('\n  ')}
  ${sgmFrameSegments()}

  // Pass 1: row max M and normaliser L (base 2, scale folded in).
  var m = -1.0e30;
  var l = 0.0;
  ${sgmFrameTiles(`${scoreTile}
      workgroupBarrier();
      var tmx = m;
      for (var c = 0u; c < 32u; c++) {
        let kp = k0 + hc * 32u + c;
        if (kp <= pos && kp < P.n) { tmx = max(tmx, Ssh[sg * 1024u + r * 64u + hc * 32u + c] * P.scaleLog2); }
      }
      var acc = 0.0;
      for (var c = 0u; c < 32u; c++) {
        let kp = k0 + hc * 32u + c;
        if (kp <= pos && kp < P.n) { acc += exp2(Ssh[sg * 1024u + r * 64u + hc * 32u + c] * P.scaleLog2 - tmx); }
      }
      l = l * exp2(m - tmx) + acc;
      m = tmx;
      workgroupBarrier();`)}
  parts[sg * 32u + lane] = vec2<f32>(m, l);
  workgroupBarrier();
  let other = parts[sg * 32u + (lane ^ 1u)];
  let M = max(m, other.x);
  let L = l * exp2(m - M) + other.y * exp2(other.x - M);
  let invL = select(0.0, 1.0 / L, L > 0.0);
  workgroupBarrier();

  // Pass 2: O = Σ P V with P already normalised, so the accumulators never need rescaling.
  ${oDecl.join('\n  ')}
  ${sgmFrameTiles(`${scoreTile}
      workgroupBarrier();
      for (var c = 0u; c < 32u; c++) {
        let kp = k0 + hc * 32u + c;
        let at = sg * 1024u + r * 64u + hc * 32u + c;
        var p = 0.0;
        if (kp <= pos && kp < P.n) { p = exp2(Ssh[at] * P.scaleLog2 - M) * invL; }
        Psh[at] = f16(p);
      }
      // every subgroup is past its K fragment loads (barrier above): V may replace K
      ${stage('V')}
      workgroupBarrier();
      for (var kc = 0u; kc < 4u; kc++) {
        let pf = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Psh, sg * 1024u + kc * 16u, false, 64u);
        ${pvSteps.join('\n        ')}
      }
      // K of the next tile replaces V only after every subgroup has read it
      workgroupBarrier();`)}
  let poisonScale = 1.0;
  ${oStore.join('\n  ')}
  if (P.returnLse == 1u && rowOk && hc == 0u) {
    LSE[h * P.m + qRow] = select(0xff800000u, bitcast<u32>((M + log2(L)) * LN2), L > 0.0);
  }
}
`;
  return { name: 'attentionSubgroupMatrixTwoPass', cacheKey: `attentionSubgroupMatrix:two-pass:f16:d${D}`, wgsl, entryPoint: 'main' };
}
