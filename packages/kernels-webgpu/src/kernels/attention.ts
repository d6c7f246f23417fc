/**
 * Block-sparse (and dense) causal flash attention.
 *
 * Shape legend: q [m, H, d], k and v [n, Hkv, d], out [m, H, d], lse [H, m] f32;
 * B block size, Nb = ceil(n / B). Query row r sits at absolute position n - m + r.
 *
 * One workgroup owns a 64-row query tile (tiles are aligned to absolute positions, so a
 * tile lies in one query block I for B = 64 or 128) of one head, and walks key tiles of 64:
 * all tiles up to the diagonal when dense, else the tiles of the blocks listed in row
 * (h, I) of the block-sparse rows (rowPtr/cols). Online softmax in base 2 (scale·log2 e is
 * folded into q), f32 accumulation, the causal mask only on the diagonal tile and the
 * ragged last tile. GQA: head h reads kv head floor(h / (H / Hkv)), no copies.
 */
import { attentionInterface, type ProgramDescriptor, type StorageDType, narrow, vec4ArrayType, widen } from './common.js';
import { TILE_SHARED, scoreTileWgsl } from './tile.js';

/** Uniform layout (12 x 4 bytes) shared with the host. */
export const ATTENTION_PARAMS = [
  'm',
  'n',
  'H',
  'Hkv',
  'B',
  'Nb',
  'dense',
  'headBase',
  'firstTile',
  'numTiles',
  'returnLse',
  'scaleLog2',
] as const;

/** `compact`: rolled loops for CPU adapters (same arithmetic, much faster to compile there). */
export function attentionProgram(dtype: StorageDType, headDim: number, compact = false): ProgramDescriptor {
  const D = headDim;
  const NV = D / 64; // output vec4 groups per row per thread: columns u*64 + tc*4 .. +3
  const HD4 = D / 4;
  const rows = [0, 1, 2, 3];
  const comps = ['x', 'y', 'z', 'w'];
  const oDecl: string[] = [];
  const oScale: string[] = [];
  const oFma: string[] = [];
  const oStore: string[] = [];
  for (const i of rows) {
    for (let u = 0; u < NV; u++) {
      oDecl.push(`var o${i}_${u} = vec4<f32>(0.0);`);
      oScale.push(`o${i}_${u} *= alpha.${comps[i]};`);
    }
  }
  for (let u = 0; u < NV; u++) {
    oFma.push(`{ let vv = QK[c * ${HD4}u + ${u * 16}u + tc];`);
    for (const i of rows) oFma.push(`  o${i}_${u} += pv.${comps[i]} * vv;`);
    oFma.push('}');
  }
  for (const i of rows) {
    const st: string[] = [];
    for (let u = 0; u < NV; u++) {
      st.push(`O[obase + ${u * 16}u + tc] = ${narrow(dtype, `o${i}_${u} * inv`)};`);
    }
    oStore.push(`{
      let pos = q0 + tr * 4u + ${i}u;
      let L = lsum.${comps[i]};
      if (pos >= rowOff && pos < P.n) {
        let row = pos - rowOff;
        let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, bad);
        let obase = ((row * P.H + h) * D) / 4u;
        ${st.join('\n        ')}
        if (P.returnLse == 1u && tc == 0u) {
          LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mrow.${comps[i]} + log2(L)) * LN2), L > 0.0);
        }
      }
    }`);
  }
  const scoreTile = scoreTileWgsl({
    dtype,
    headDim: D,
    qIndex4: (dc) => `((qRowL * P.H + h) * D + ${dc} + ld) / 4u`,
    qValid: 'qValidL',
    qScale: 'P.scaleLog2',
    compact,
  });
  const maskCode = compact
    ? `for (var j = 0u; j < 4u; j++) {
          let kp = k0 + tc * 4u + j;
          let qp = q0 + tr * 4u;
          if (kp > qp || kp >= P.n) { s0[j] = MASKED; }
          if (kp > qp + 1u || kp >= P.n) { s1[j] = MASKED; }
          if (kp > qp + 2u || kp >= P.n) { s2[j] = MASKED; }
          if (kp > qp + 3u || kp >= P.n) { s3[j] = MASKED; }
        }`
    : rows
        .map((i) =>
          [0, 1, 2, 3]
            .map(
              (j) =>
                `if (k0 + tc * 4u + ${j}u > q0 + tr * 4u + ${i}u || k0 + tc * 4u + ${j}u >= P.n) { s${i}.${comps[j]} = MASKED; }`,
            )
            .join('\n        '),
        )
        .join('\n        ');
  const wgsl = /* wgsl */ `
${attentionInterface({ q: vec4ArrayType(dtype), k: vec4ArrayType(dtype), v: vec4ArrayType(dtype), o: vec4ArrayType(dtype) })}

const D: u32 = ${D}u;
const MASKED: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
${TILE_SHARED}
var<workgroup> Ps: array<vec4<f32>, 1024>; // [key c][row group]: P transposed
var<workgroup> red: array<f32, 1024>;      // [row][tc] row partials
var<workgroup> seg: vec2<u32>;
var<workgroup> tiles: vec2<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  let lr = lid / 4u;
  let ld = (lid % 4u) * 4u;
  let h = P.headBase + wid.x;
  let g = h / (P.H / P.Hkv);
  // Heads fastest, heaviest tiles (most keys) first: every head's long tiles start in the
  // first wave, so the tail holds only short ones (and a kv group's heads share K/V in L2).
  let t = P.firstTile + P.numTiles - 1u - wid.y;
  let q0 = t * 64u;
  let rowOff = P.n - P.m;
  let lpos = q0 + lr;
  let qValidL = lpos >= rowOff && lpos < P.n;
  let qRowL = select(0u, lpos - rowOff, qValidL);
  ${oDecl.join('\n  ')}
  var mrow = vec4<f32>(-1.0e30);
  var lsum = vec4<f32>(0.0);
  let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    atomicStore(&badInput, 0u);
    if (P.dense == 1u) { seg = vec2<u32>(0u, 1u); }
    else { seg = vec2<u32>(rowPtr[h * P.Nb + I], rowPtr[h * P.Nb + I + 1u]); }
  }
  let sg = workgroupUniformLoad(&seg);
  for (var si = sg.x; si < sg.y; si++) {
    if (lid == 0u) {
      if (P.dense == 1u) { tiles = vec2<u32>(0u, t + 1u); }
      else { let J = cols[si]; tiles = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
    }
    let kr = workgroupUniformLoad(&tiles);
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      ${scoreTile}
      if (kt == t || k0 + 64u > P.n) {
        ${maskCode}
      }
      red[(tr * 4u) * 16u + tc] = max(max(s0.x, s0.y), max(s0.z, s0.w));
      red[(tr * 4u + 1u) * 16u + tc] = max(max(s1.x, s1.y), max(s1.z, s1.w));
      red[(tr * 4u + 2u) * 16u + tc] = max(max(s2.x, s2.y), max(s2.z, s2.w));
      red[(tr * 4u + 3u) * 16u + tc] = max(max(s3.x, s3.y), max(s3.z, s3.w));
      workgroupBarrier();
      var tm = mrow;
      for (var c = 0u; c < 16u; c++) {
        tm = max(tm, vec4<f32>(red[(tr * 4u) * 16u + c], red[(tr * 4u + 1u) * 16u + c],
                               red[(tr * 4u + 2u) * 16u + c], red[(tr * 4u + 3u) * 16u + c]));
      }
      let alpha = exp2(mrow - tm);
      mrow = tm;
      let p0 = exp2(s0 - tm.x);
      let p1 = exp2(s1 - tm.y);
      let p2 = exp2(s2 - tm.z);
      let p3 = exp2(s3 - tm.w);
      let one = vec4<f32>(1.0);
      lsum = lsum * alpha + vec4<f32>(dot(p0, one), dot(p1, one), dot(p2, one), dot(p3, one));
      Ps[(tc * 4u) * 16u + tr] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
      Ps[(tc * 4u + 1u) * 16u + tr] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
      Ps[(tc * 4u + 2u) * 16u + tr] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
      Ps[(tc * 4u + 3u) * 16u + tr] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
      ${oScale.join('\n      ')}
      for (var vc = 0u; vc < 64u; vc += 16u) {
        for (var x = lid; x < ${16 * HD4}u; x += 256u) {
          let kpos = k0 + vc + x / ${HD4}u;
          var vv = vec4<f32>(0.0);
          if (kpos < P.n) { vv = ${widen(dtype, `V[((kpos * P.Hkv + g) * D) / 4u + x % ${HD4}u]`)}; }
          if (nonFinite(vv)) { atomicStore(&badInput, 1u); }
          QK[x] = vv;
        }
        workgroupBarrier();
        for (var c = 0u; c < 16u; c++) {
          let pv = Ps[(vc + c) * 16u + tr];
          ${oFma.join('\n          ')}
        }
        workgroupBarrier();
      }
    }
    // lane 0 rewrites tiles next iteration: every lane must have read it first
    workgroupBarrier();
  }
  red[(tr * 4u) * 16u + tc] = lsum.x;
  red[(tr * 4u + 1u) * 16u + tc] = lsum.y;
  red[(tr * 4u + 2u) * 16u + tc] = lsum.z;
  red[(tr * 4u + 3u) * 16u + tc] = lsum.w;
  workgroupBarrier();
  // NaN/Inf in the inputs must not come out as a finite answer: poison this tile's rows.
  let bad = atomicLoad(&badInput) != 0u;
  let poison = bitcast<f32>(select(0u, 0x7fc00000u, bad));
  lsum = vec4<f32>(0.0);
  for (var c = 0u; c < 16u; c++) {
    lsum += vec4<f32>(red[(tr * 4u) * 16u + c], red[(tr * 4u + 1u) * 16u + c],
                      red[(tr * 4u + 2u) * 16u + c], red[(tr * 4u + 3u) * 16u + c]);
  }
  ${oStore.join('\n  ')}
}
`;
  return { name: 'attention', cacheKey: `attention:${dtype}:d${D}${compact ? ':compact' : ''}`, wgsl, entryPoint: 'main' };
}
