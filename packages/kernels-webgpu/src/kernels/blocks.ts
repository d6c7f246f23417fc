/**
 * Block-level primitives: the PE pooled block map and the mask expansion (VS-to-rows).
 *
 * Shape legend: H heads, Nb = ceil(n / B) blocks, d head dim; Q̄ [H][Nb][d] and
 * K̄ [Hkv][Nb][d] are block means (f32) from blockMeanProgram.
 */
import { type ProgramDescriptor, workgroupInclusiveScan } from './common.js';

/**
 * PE pooled map Ā[I, J] = softmax_J(Q̄_I · K̄_J · scale) over J <= I, one workgroup per
 * (query block I, listed head). Rows are written flattened row-major (I, then J) at
 * I (I + 1) / 2 + J; query blocks without query rows (chunked prefill) are written as 0.
 */
export function peMapProgram(headDim: number): ProgramDescriptor {
  const D4 = headDim / 4;
  const wgsl = /* wgsl */ `
struct Params { H: u32, Hkv: u32, Nb: u32, B: u32, firstPos: u32, n: u32, scale: f32, p0: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Qbar: array<vec4<f32>>;  // [H][Nb][d/4]
@group(0) @binding(2) var<storage, read> Kbar: array<vec4<f32>>;  // [Hkv][Nb][d/4]
@group(0) @binding(3) var<storage, read> heads: array<u32>;       // heads of this dispatch
@group(0) @binding(4) var<storage, read_write> map: array<f32>;   // [slot][Nb (Nb + 1) / 2]
var<workgroup> qv: array<vec4<f32>, ${D4}>;
var<workgroup> red: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let I = wid.x;
  let slot = wid.y;
  let h = heads[slot];
  let g = h / (P.H / P.Hkv);
  let entries = P.Nb * (P.Nb + 1u) / 2u;
  let base = slot * entries + I * (I + 1u) / 2u;
  let rowActive = max(I * P.B, P.firstPos) < min(I * P.B + P.B, P.n);
  if (lid < ${D4}u) { qv[lid] = Qbar[(h * P.Nb + I) * ${D4}u + lid]; }
  workgroupBarrier();
  var mx = -3.0e38;
  for (var J = lid; J <= I; J += 256u) {
    var x = 0.0;
    for (var c = 0u; c < ${D4}u; c++) { x += dot(qv[c], Kbar[(g * P.Nb + J) * ${D4}u + c]); }
    x *= P.scale;
    map[base + J] = x;
    mx = max(mx, x);
  }
  red[lid] = mx;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  let M = red[0];
  workgroupBarrier();
  var z = 0.0;
  for (var J = lid; J <= I; J += 256u) {
    let e = exp(map[base + J] - M);
    map[base + J] = e;
    z += e;
  }
  red[lid] = z;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
    workgroupBarrier();
  }
  let Z = red[0];
  for (var J = lid; J <= I; J += 256u) {
    map[base + J] = select(0.0, map[base + J] / Z, rowActive);
  }
}
`;
  return { name: 'peMap', cacheKey: `peMap:d${headDim}`, wgsl, entryPoint: 'main' };
}

const MERGE = /* wgsl */ `
  // Three ascending streams: vertical J <= I, slash I - O for O <= I (walked from the
  // largest O <= I down), and the row's own cols. Emit their sorted union.
  let r = h * P.Nb + I;
  var vi = vsPtr[h];
  let vEnd = vsPtr[h + 1u];
  var sHi = i32(vsPtr[P.H + 1u + h + 1u]) - 1;
  let sLo = i32(vsPtr[P.H + 1u + h]);
  while (sHi >= sLo && vsList[P.sliceBase + u32(sHi)] > I) { sHi--; }
  var ri = 0u;
  var rEnd = 0u;
  if (P.hasRows == 1u) { ri = rowPtr[r]; rEnd = rowPtr[r + 1u]; }
  var last = 0xffffffffu;
  var count = 0u;
  loop {
    var best = 0xffffffffu;
    if (vi < vEnd) { let J = vsList[vi]; if (J <= I) { best = min(best, J); } }
    if (sHi >= sLo) { best = min(best, I - vsList[P.sliceBase + u32(sHi)]); }
    if (ri < rEnd) { best = min(best, cols[ri]); }
    if (best == 0xffffffffu) { break; }
    if (vi < vEnd && vsList[vi] == best) { vi++; }
    if (sHi >= sLo && I - vsList[P.sliceBase + u32(sHi)] == best) { sHi--; }
    if (ri < rEnd && cols[ri] == best) { ri++; }
    if (best != last) {
      EMIT
      count++;
      last = best;
    }
  }`;

const EXPAND_HEAD = /* wgsl */ `
struct Params { H: u32, Nb: u32, hasRows: u32, sliceBase: u32, rowWidth: u32, p0: u32, p1: u32, p2: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> vsPtr: array<u32>;  // [H + 1] vertical ptr, then [H + 1] slash ptr
@group(0) @binding(2) var<storage, read> vsList: array<u32>; // vertical lists, then slash lists at sliceBase
@group(0) @binding(3) var<storage, read> rowPtr: array<u32>;
@group(0) @binding(4) var<storage, read> cols: array<u32>;`;

/** Pass 1 of VS-to-rows: the union size of every (head, query block) row, at outPtr[r + 1]. */
export function expandCountProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `${EXPAND_HEAD}
@group(0) @binding(5) var<storage, read_write> outPtr: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let idx = gid.x + gid.y * P.rowWidth;
  if (idx >= P.H * P.Nb) { return; }
  let h = idx / P.Nb;
  let I = idx % P.Nb;
  ${MERGE.replace('EMIT', '')}
  outPtr[r + 1u] = count;
  if (r == 0u) { outPtr[0] = 0u; }
}
`;
  return { name: 'expandCount', cacheKey: 'expandCount', wgsl, entryPoint: 'main' };
}

/** Pass 3 of VS-to-rows: write each row's sorted union at its prefix offset. */
export function expandFillProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `${EXPAND_HEAD}
@group(0) @binding(5) var<storage, read> outPtr: array<u32>;
@group(0) @binding(6) var<storage, read_write> outCols: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let idx = gid.x + gid.y * P.rowWidth;
  if (idx >= P.H * P.Nb) { return; }
  let h = idx / P.Nb;
  let I = idx % P.Nb;
  let at = outPtr[h * P.Nb + I];
  ${MERGE.replace('EMIT', 'outCols[at + count] = best;')}
}
`;
  return { name: 'expandFill', cacheKey: 'expandFill', wgsl, entryPoint: 'main' };
}

/** Pass 2 of VS-to-rows: in-place inclusive scan of counts at ptr[1..R] (one workgroup). */
export function scanProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { R: u32, p0: u32, p1: u32, p2: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> ptr: array<u32>;
var<workgroup> sums: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
  let chunk = (P.R + 255u) / 256u;
  let a = min(lid * chunk, P.R);
  let b = min(a + chunk, P.R);
  var s = 0u;
  for (var r = a; r < b; r++) { s += ptr[r + 1u]; }
  sums[lid] = s;
  workgroupBarrier();
  ${workgroupInclusiveScan('sums')}
  var run = sums[lid] - s;
  for (var r = a; r < b; r++) { run += ptr[r + 1u]; ptr[r + 1u] = run; }
  if (lid == 0u) { ptr[0] = 0u; }
}
`;
  return { name: 'scan', cacheKey: 'scan', wgsl, entryPoint: 'main' };
}
