/**
 * Fused proxy statistics: the reductions of Â[h] = softmax_j(Q̂ K_hᵀ · scale) without ever
 * storing Â ([H, b, n]). Q̂ = the last b = min(B, m) query rows; proxy row i sits at
 * absolute position n - b + i and sees keys j <= n - b + i.
 *
 * Shape legend: q [m, H, d], k [n, Hkv, d], b proxy rows, B block size, Nb = ceil(n / B),
 * T = ceil(n / 64) key tiles.
 *
 *  1. rowStats   per (head, row tile, key split): online max M, normaliser Z and
 *                E = Σ 2^(s-M) (s-M) over the split (s in log2 units), combined across the
 *                16 lanes of each row;
 *  2. rowCombine per (head, row): merges the splits into M, Z and the row entropy
 *                ln Z - ln 2 · E / Z (nats);
 *  3. scores     per (head, key tile): recomputes the tile's 64 x b scores, normalises them
 *                with M, Z, and reduces them to a_v (column sums / b) and partial slash sums
 *                along the b + 63 diagonals crossing the tile;
 *  4. slashCombine per (head, offset o): a_s[o] from the <= 3 tiles its diagonal crosses;
 *  5. blockSums  per (head, block J): p_v[J], p_s[J]; J = Nb gives C_struct (sink and local
 *                windows counted once each, like the reference);
 *  6. blockMean / qhatMean / pooledLogits: K̄_J, mean_i Q̂_i and their scaled dot products,
 *                whose softmax over J is FlexPrefill's pooled estimate ā.
 *
 * Passes 1 and 3 take their 64 x 64 score tiles from a ScoreTile: FMAs (./tile.ts, every
 * adapter) or subgroup matrices (./proxy-tile-subgroup-matrix.ts, tensor cores); the rest of
 * their WGSL is the same for both.
 */
import { LOG2E, type ProgramDescriptor, type StorageDType, vec4ArrayType, widen } from './common.js';
import { subgroupMatrixScoreTile } from './proxy-tile-subgroup-matrix.js';
import { type ScoreTile, fmaScoreTile } from './tile.js';

export { LOG2E };

/** Slash partials per (head, key tile): b + 63 <= 191 diagonals, padded. */
export const SLASH_STRIDE = 192;

/**
 * The score tiles of the two passes over every key: 'fma' (every adapter, f16 and f32) or
 * 'subgroup-matrix' (tensor cores; f16 at head dims 64 and 128, where the tensor-core
 * attention runs).
 */
export type ScoreTileKind = 'fma' | 'subgroup-matrix';

function scoreTile(kind: ScoreTileKind, dtype: StorageDType, headDim: number, compact: boolean): ScoreTile {
  if (kind === 'fma') return fmaScoreTile(dtype, headDim, compact);
  if (dtype !== 'f16') throw new RangeError('the tensor-core proxy tile reads f16 storage only');
  return subgroupMatrixScoreTile(headDim);
}

export function rowStatsProgram(dtype: StorageDType, headDim: number, compact = false, kind: ScoreTileKind = 'fma'): ProgramDescriptor {
  const D = headDim;
  const comps = ['x', 'y', 'z', 'w'];
  const st = scoreTile(kind, dtype, D, compact);
  const tile = st.tile;
  // (the tensor-core tile is GPU-only: its update is always the unrolled one)
  compact = compact && kind === 'fma';
  // the reduction's scratch: its own array, or the tile's score memory (every thread past its last read)
  const sc = st.scratch;
  const redGet = (i: string) => (sc ? sc.get4(i) : `red[${i}]`);
  const redSet = (i: string, v: string) => (sc ? `${sc.set4(i, v)};` : `red[${i}] = ${v};`);
  const updCompact = `{
      var sa = array<vec4<f32>, 4>(s0, s1, s2, s3);
      for (var i = 0u; i < 4u; i++) {
        var s = sa[i];
        let pos = P.n - P.b + rt * 64u + tr * 4u + i;
        for (var j = 0u; j < 4u; j++) {
          let kp = k0 + tc * 4u + j;
          if (kp > pos || kp >= P.n) { s[j] = MASKED; }
        }
        let mx = max(mrow[i], max(max(s.x, s.y), max(s.z, s.w)));
        let a = exp2(mrow[i] - mx);
        let p = exp2(s - mx);
        let sm = select(s - mx, vec4<f32>(0.0), p == vec4<f32>(0.0));
        erow[i] = a * (erow[i] + (mrow[i] - mx) * zrow[i]) + dot(p, sm);
        zrow[i] = a * zrow[i] + dot(p, vec4<f32>(1.0));
        mrow[i] = mx;
      }
    }`;
  const upd = compact ? updCompact : [0, 1, 2, 3]
    .map((i) => {
      const c = comps[i];
      return `{
        let i = rt * 64u + tr * 4u + ${i}u;
        var s = s${i};
        let pos = P.n - P.b + i;
        ${[0, 1, 2, 3].map((j) => `if (k0 + tc * 4u + ${j}u > pos || k0 + tc * 4u + ${j}u >= P.n) { s.${comps[j]} = MASKED; }`).join('\n        ')}
        let mx = max(mrow.${c}, max(max(s.x, s.y), max(s.z, s.w)));
        let a = exp2(mrow.${c} - mx);
        let p = exp2(s - mx);
        let sm = select(s - mx, vec4<f32>(0.0), p == vec4<f32>(0.0));
        erow.${c} = a * (erow.${c} + (mrow.${c} - mx) * zrow.${c}) + dot(p, sm);
        zrow.${c} = a * zrow.${c} + dot(p, vec4<f32>(1.0));
        mrow.${c} = mx;
      }`;
    })
    .join('\n      ');
  const wgsl = /* wgsl */ `${st.enables}
struct Params {
  m: u32, n: u32, H: u32, Hkv: u32,
  b: u32, tilesPerSplit: u32, numSplits: u32, headBase: u32,
  scaleLog2: f32, p0: u32, p1: u32, p2: u32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: ${st.qType};
@group(0) @binding(2) var<storage, read> K: ${st.kType};
@group(0) @binding(3) var<storage, read_write> part: array<vec4<f32>>; // [H][b][splits] (M, Z, E, 0)

const D: u32 = ${D}u;
const MASKED: f32 = -3.0e38;
${st.shared}
${sc ? '' : 'var<workgroup> red: array<vec4<f32>, 1024>;'}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32${st.builtins}) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  let lr = lid / 4u;
  let ld = (lid % 4u) * 4u;
  let split = wid.x;
  let rt = wid.y;
  let h = P.headBase + wid.z;
  let g = h / (P.H / P.Hkv);
  ${st.registers}
  if (lid == 0u) { atomicStore(&badInput, 0u); }
  workgroupBarrier();
  ${st.rowTile}
  var mrow = vec4<f32>(-1.0e30);
  var zrow = vec4<f32>(0.0);
  var erow = vec4<f32>(0.0);
  let numTiles = (P.n + 63u) / 64u;
  let kt0 = split * P.tilesPerSplit;
  let kt1 = min(kt0 + P.tilesPerSplit, numTiles);
  for (var kt = kt0; kt < kt1; kt++) {
    let k0 = kt * 64u;
    ${st.keyTile({ first: 'kt == kt0', next: 'kt + 1u < kt1' })}
    ${tile}
    ${upd}
  }
  ${sc ? 'workgroupBarrier();' : ''}
  for (var i = 0u; i < 4u; i++) {
    ${redSet('(tr * 4u + i) * 16u + tc', 'vec4<f32>(mrow[i], zrow[i], erow[i], 0.0)')}
  }
  workgroupBarrier();
  if (lid < 64u) {
    let i = rt * 64u + lid;
    var M = -1.0e30;
    for (var c = 0u; c < 16u; c++) { M = max(M, ${redGet('lid * 16u + c')}.x); }
    var Z = 0.0;
    var E = 0.0;
    for (var c = 0u; c < 16u; c++) {
      let r = ${redGet('lid * 16u + c')};
      let a = exp2(r.x - M);
      Z += a * r.y;
      E += a * (r.z + (r.x - M) * r.y);
    }
    let bad = f32(atomicLoad(&badInput));
    if (i < P.b) { part[(h * P.b + i) * P.numSplits + split] = vec4<f32>(M, Z, E, bad); }
  }
}
`;
  return { name: `rowStats${st.tag}`, cacheKey: `rowStats${st.tag}:${dtype}:d${D}${compact ? ':compact' : ''}`, wgsl, entryPoint: 'main' };
}

export function rowCombineProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { count: u32, b: u32, numSplits: u32, p0: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> rows: array<vec4<f32>>; // [H][b] (M, Z, entropy, 0)
const LN2: f32 = 0.6931471805599453;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x;
  if (r >= P.count) { return; }
  var M = -1.0e30;
  for (var s = 0u; s < P.numSplits; s++) { M = max(M, part[r * P.numSplits + s].x); }
  var Z = 0.0;
  var E = 0.0;
  var bad = 0.0;
  for (var s = 0u; s < P.numSplits; s++) {
    let x = part[r * P.numSplits + s];
    let a = exp2(x.x - M);
    Z += a * x.y;
    E += a * (x.z + (x.x - M) * x.y);
    bad = max(bad, x.w);
  }
  // w: 1 when q or k held NaN/Inf (the host raises NON_FINITE)
  rows[r] = vec4<f32>(M, Z, log(Z) - LN2 * E / Z, bad);
}
`;
  return { name: 'rowCombine', cacheKey: 'rowCombine', wgsl, entryPoint: 'main' };
}

export function scoresProgram(dtype: StorageDType, headDim: number, compact = false, kind: ScoreTileKind = 'fma'): ProgramDescriptor {
  const D = headDim;
  const comps = ['x', 'y', 'z', 'w'];
  const st = scoreTile(kind, dtype, D, compact);
  const tile = st.tile;
  compact = compact && kind === 'fma';
  // the normalised tile: its own workgroup array (FMA), or the tensor-core tile's S in place
  // (each thread overwrites the 4 x 4 block it read); PT(r, c) is element (row r, key c)
  const sc = st.scratch;
  const PT = (r: string, c: string) => (sc ? sc.get1(r, c) : `Pt[(${r}) * 65u + ${c}]`);
  const normCompact = `{
      var sa = array<vec4<f32>, 4>(s0, s1, s2, s3);
      for (var i = 0u; i < 4u; i++) {
        let r = tr * 4u + i;
        let ii = rt * 64u + r;
        var pv = vec4<f32>(0.0);
        if (ii < P.b) {
          let st = rows[h * P.b + ii];
          let pos = P.n - P.b + ii;
          pv = exp2(sa[i] - st.x) / st.y;
          for (var j = 0u; j < 4u; j++) {
            let kp = k0 + tc * 4u + j;
            if (kp > pos || kp >= P.n) { pv[j] = 0.0; }
          }
        }
        for (var j = 0u; j < 4u; j++) { Pt[r * 65u + tc * 4u + j] = pv[j]; }
      }
    }`;
  const norm = compact ? normCompact : [0, 1, 2, 3]
    .map((i) => {
      return `{
        let r = tr * 4u + ${i}u;
        let i = rt * 64u + r;
        var pv = vec4<f32>(0.0);
        if (i < P.b) {
          let st = rows[h * P.b + i];
          let pos = P.n - P.b + i;
          pv = exp2(s${i} - st.x) / st.y;
          ${[0, 1, 2, 3].map((j) => `if (k0 + tc * 4u + ${j}u > pos || k0 + tc * 4u + ${j}u >= P.n) { pv.${comps[j]} = 0.0; }`).join('\n          ')}
        }
        ${sc ? `${sc.set4(`r * ${sc.rowVec4}u + tc`, 'pv')};` : [0, 1, 2, 3].map((j) => `Pt[r * 65u + tc * 4u + ${j}u] = pv.${comps[j]};`).join(' ')}
      }`;
    })
    .join('\n    ');
  const wgsl = /* wgsl */ `${st.enables}
struct Params {
  m: u32, n: u32, H: u32, Hkv: u32,
  b: u32, numKeyTiles: u32, headBase: u32, p0: u32,
  scaleLog2: f32, invB: f32, p1: u32, p2: u32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: ${st.qType};
@group(0) @binding(2) var<storage, read> K: ${st.kType};
@group(0) @binding(3) var<storage, read> rows: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> av: array<f32>;         // [H][n]
@group(0) @binding(5) var<storage, read_write> slashPart: array<f32>;  // [H][T][${SLASH_STRIDE}]

const D: u32 = ${D}u;
${st.shared}
${sc ? '' : `var<workgroup> Pt: array<f32, ${64 * 65}>; // [row][key], padded`}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32${st.builtins}) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  let lr = lid / 4u;
  let ld = (lid % 4u) * 4u;
  let kt = wid.x;
  let h = P.headBase + wid.y;
  let g = h / (P.H / P.Hkv);
  let k0 = kt * 64u;
  var vacc = 0.0;
  var sacc = 0.0;
  let rowTiles = (P.b + 63u) / 64u;
  ${st.registers}
  ${st.keyTile()}
  for (var rt = 0u; rt < rowTiles; rt++) {
    ${st.rowTile}
    ${tile}
    ${norm}
    workgroupBarrier();
    if (lid < 64u) {
      for (var r = 0u; r < 64u; r++) { vacc += ${PT('r', 'lid')}; }
    }
    // diagonal u holds offset o = u + n - b - k0 - 63; row i meets it at key c = i + 63 - u
    if (lid < P.b + 63u) {
      for (var r = 0u; r < 64u; r++) {
        let c = i32(rt * 64u + r + 63u) - i32(lid);
        if (c >= 0 && c < 64) { sacc += ${PT('r', 'u32(c)')}; }
      }
    }
    workgroupBarrier();
  }
  if (lid < 64u && k0 + lid < P.n) { av[h * P.n + k0 + lid] = vacc * P.invB; }
  if (lid < ${SLASH_STRIDE}u) { slashPart[(h * P.numKeyTiles + kt) * ${SLASH_STRIDE}u + lid] = sacc; }
}
`;
  return { name: `scores${st.tag}`, cacheKey: `scores${st.tag}:${dtype}:d${D}${compact ? ':compact' : ''}`, wgsl, entryPoint: 'main' };
}

export function slashCombineProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { n: u32, b: u32, numKeyTiles: u32, heads: u32, invB: f32, rowWidth: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> slashPart: array<f32>;
@group(0) @binding(2) var<storage, read_write> as_: array<f32>; // [H][n] by offset
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let idx = gid.x + gid.y * P.rowWidth;
  if (idx >= P.n * P.heads) { return; }
  let h = idx / P.n;
  let o = idx % P.n;
  let lo = i32(P.n) - i32(P.b) - i32(o);
  let hi = i32(P.n) - 1 - i32(o);
  var sum = 0.0;
  for (var t = u32(max(lo, 0)) / 64u; t <= u32(hi) / 64u; t++) {
    let u = i32(o) + i32(P.b) + i32(t * 64u) + 63 - i32(P.n);
    if (u >= 0 && u < i32(P.b) + 63) {
      sum += slashPart[(h * P.numKeyTiles + t) * ${SLASH_STRIDE}u + u32(u)];
    }
  }
  as_[idx] = sum * P.invB;
}
`;
  return { name: 'slashCombine', cacheKey: 'slashCombine', wgsl, entryPoint: 'main' };
}

export function blockSumsProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { n: u32, B: u32, Nb: u32, heads: u32, sinkEnd: u32, localStart: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> av: array<f32>;
@group(0) @binding(2) var<storage, read> as_: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [H][Nb + 1][2]; entry Nb holds (C_struct, 0)
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let idx = gid.x;
  if (idx >= (P.Nb + 1u) * P.heads) { return; }
  let h = idx / (P.Nb + 1u);
  let J = idx % (P.Nb + 1u);
  let base = h * P.n;
  if (J == P.Nb) {
    var c = 0.0;
    for (var j = 0u; j < P.sinkEnd; j++) { c += av[base + j]; }
    for (var j = P.localStart; j < P.n; j++) { c += av[base + j]; }
    out[idx * 2u] = c;
    out[idx * 2u + 1u] = 0.0;
    return;
  }
  var pv = 0.0;
  var ps = 0.0;
  let j1 = min(J * P.B + P.B, P.n);
  for (var j = J * P.B; j < j1; j++) { pv += av[base + j]; ps += as_[base + j]; }
  out[idx * 2u] = pv;
  out[idx * 2u + 1u] = ps;
}
`;
  return { name: 'blockSums', cacheKey: 'blockSums', wgsl, entryPoint: 'main' };
}

/**
 * Block means: out[(head, J)] = mean of rows of block J (absolute positions, the tensor's
 * row 0 at position firstPos; partial and empty blocks over their real rows; empty -> 0).
 */
export function blockMeanProgram(dtype: StorageDType, headDim: number): ProgramDescriptor {
  const D4 = headDim / 4;
  const wgsl = /* wgsl */ `
struct Params { rows: u32, heads: u32, firstPos: u32, Nb: u32, B: u32, rowWidth: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: ${vec4ArrayType(dtype)};
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>; // [heads][Nb][d/4]
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let idx = gid.x + gid.y * P.rowWidth;
  if (idx >= P.heads * P.Nb * ${D4}u) { return; }
  let d4 = idx % ${D4}u;
  let J = (idx / ${D4}u) % P.Nb;
  let h = idx / (${D4}u * P.Nb);
  let p0 = max(J * P.B, P.firstPos);
  let p1 = min(J * P.B + P.B, P.firstPos + P.rows);
  var acc = vec4<f32>(0.0);
  for (var p = p0; p < p1; p++) {
    let r = p - P.firstPos;
    acc += ${widen(dtype, `X[(r * P.heads + h) * ${D4}u + d4]`)};
  }
  out[idx] = select(vec4<f32>(0.0), acc / f32(max(p1, p0) - p0), p1 > p0);
}
`;
  return { name: 'blockMean', cacheKey: `blockMean:${dtype}:d${headDim}`, wgsl, entryPoint: 'main' };
}

/** Mean of the last b query rows per head, then its scaled dot with every K̄_J. */
export function pooledLogitsProgram(dtype: StorageDType, headDim: number): ProgramDescriptor {
  const D4 = headDim / 4;
  const wgsl = /* wgsl */ `
struct Params { m: u32, H: u32, Hkv: u32, b: u32, Nb: u32, scale: f32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: ${vec4ArrayType(dtype)};
@group(0) @binding(2) var<storage, read> Kbar: array<vec4<f32>>; // [Hkv][Nb][d/4]
@group(0) @binding(3) var<storage, read_write> logits: array<f32>; // [H][Nb]
var<workgroup> qm: array<vec4<f32>, ${D4}>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.y;
  let g = h / (P.H / P.Hkv);
  if (lid < ${D4}u) {
    var acc = vec4<f32>(0.0);
    for (var t = 0u; t < P.b; t++) {
      acc += ${widen(dtype, `Q[((P.m - P.b + t) * P.H + h) * ${D4}u + lid]`)};
    }
    qm[lid] = acc / f32(P.b);
  }
  workgroupBarrier();
  let J = wid.x * 256u + lid;
  if (J >= P.Nb) { return; }
  var dotv = 0.0;
  for (var c = 0u; c < ${D4}u; c++) { dotv += dot(qm[c], Kbar[(g * P.Nb + J) * ${D4}u + c]); }
  logits[h * P.Nb + J] = dotv * P.scale;
}
`;
  return { name: 'pooledLogits', cacheKey: `pooledLogits:${dtype}:d${headDim}`, wgsl, entryPoint: 'main' };
}
