/**
 * The PE heads' γ cut on the GPU, over the pooled maps peMapProgram wrote for every head
 * (slot h = head h): the rule of ../coverage.ts (keep the entries at or above the largest
 * threshold whose entries hold γ of the map's mass, mass in fixed point), so the device plan
 * keeps exactly the blocks the host cut keeps. Heads the device routed VS (routes[h] = 1)
 * are skipped by every pass.
 *
 *   peHist (pass 0): per head, the fixed-point mass of its entries by the top 16 bits
 *   peFind (pass 0): the top-16-bit bucket where the running mass (largest values first)
 *                    reaches γ, and the mass above it; or "keep every entry"
 *   peHist (pass 1): the mass of that bucket's entries by their low 16 bits
 *   peFind (pass 1): the exact threshold T (bits)
 *   peRows (count, scan, fill): each row's kept J (bits >= T) as sorted block rows over
 *                    every head (VS heads' rows empty), the form expandBuffers merges
 *
 * Integer sums cannot depend on the order atomics land in: the whole map's mass is about
 * 2^31 units, so no sum overflows a u32.
 */
import { type ProgramDescriptor, workgroupInclusiveScan } from './common.js';

/** Buckets of one head's histogram (16 bits). */
export const PE_CUT_BUCKETS = 65536;

/** WGSL: whether query block I holds query rows (uniforms B, firstPos = n - m, n). */
const ROW_ACTIVE = /* wgsl */ `
fn rowActive(I: u32) -> bool {
  return max(I * P.B, P.firstPos) < min(I * P.B + P.B, P.n);
}
`;

/** WGSL of fixedMass (coverage.ts): floor(v · 2^31 / A) from v's bits, integers only. */
const FIXED_MASS = /* wgsl */ `
fn fixedMass(bits: u32, A: u32) -> u32 {
  let E = min((bits >> 23u) & 0xffu, 127u);
  if (E == 0u) { return 0u; }
  let m = (bits & 0x7fffffu) | 0x800000u;
  if (E >= 119u) { return (m << (E - 119u)) / A; }
  let s = 119u - E;
  if (s >= 24u) { return 0u; }
  return (m >> s) / A;
}
`;

/** Per head: state (0 not yet, 1 bucket found, 2 keep all), the bucket, the mass above it, T. */
const CUT_STRUCT = 'struct Cut { state: u32, hi: u32, above: u32, T: u32 }';

/**
 * Histogram of one head's fixed-point mass, one workgroup per (query block I, head): pass 0
 * by the top 16 bits, pass 1 (heads in state 1) by the low 16 bits of the entries in the
 * found bucket.
 */
export function peHistProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { H: u32, Nb: u32, B: u32, firstPos: u32, n: u32, A: u32, phase: u32, p0: u32 }
${CUT_STRUCT}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> routes: array<u32>;
@group(0) @binding(2) var<storage, read> map: array<u32>;     // [H][Nb (Nb + 1) / 2] f32 bits
@group(0) @binding(3) var<storage, read> cut: array<Cut>;
@group(0) @binding(4) var<storage, read_write> hist: array<atomic<u32>>;  // [H][65536]
${FIXED_MASS}${ROW_ACTIVE}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let I = wid.x;
  let h = wid.y;
  if (routes[h] != 0u || !rowActive(I)) { return; }
  let c = cut[h];
  if (P.phase == 1u && c.state != 1u) { return; }
  let entries = P.Nb * (P.Nb + 1u) / 2u;
  let base = h * entries + I * (I + 1u) / 2u;
  for (var J = lid; J <= I; J += 256u) {
    let bits = map[base + J];
    let w = fixedMass(bits, P.A);
    if (w == 0u) { continue; }
    if (P.phase == 0u) {
      atomicAdd(&hist[h * ${PE_CUT_BUCKETS}u + (bits >> 16u)], w);
    } else if ((bits >> 16u) == c.hi) {
      atomicAdd(&hist[h * ${PE_CUT_BUCKETS}u + (bits & 0xffffu)], w);
    }
  }
}
`;
  return { name: 'peHist', cacheKey: 'peHist', wgsl, entryPoint: 'main' };
}

/**
 * One workgroup per head walks its histogram from the largest bucket down until the running
 * mass (from `above` in pass 1) reaches G: 256 threads each sum 256 buckets, a workgroup scan
 * of those sums finds the thread whose buckets hold the crossing, and that thread walks them.
 * Pass 0 writes the bucket and the mass above it (or state 2: the mass never reaches G);
 * pass 1 the threshold T.
 */
export function peFindProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { H: u32, G: u32, phase: u32, p0: u32 }
${CUT_STRUCT}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> routes: array<u32>;
@group(0) @binding(2) var<storage, read> hist: array<u32>;
@group(0) @binding(3) var<storage, read_write> cut: array<Cut>;
var<workgroup> sums: array<u32, 256>;
var<workgroup> found: array<u32, 2>;
var<workgroup> skipHead: u32;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let c = cut[h];
  // (a workgroup-uniform exit, so the barriers below stay in uniform control flow)
  if (lid == 0u) { skipHead = select(0u, 1u, routes[h] != 0u || (P.phase == 1u && c.state != 1u)); }
  if (workgroupUniformLoad(&skipHead) == 1u) { return; }
  var start = 0u;
  if (P.phase == 1u) { start = c.above; }
  // thread t: buckets 65535 - 256 t down to 65280 - 256 t
  let top = ${PE_CUT_BUCKETS - 1}u - lid * 256u;
  let row = h * ${PE_CUT_BUCKETS}u;
  var s = 0u;
  for (var i = 0u; i < 256u; i++) { s += hist[row + top - i]; }
  sums[lid] = s;
  if (lid == 0u) { found[0] = 0xffffffffu; found[1] = 0u; }
  workgroupBarrier();
  ${workgroupInclusiveScan('sums')}
  var cum = start + sums[lid] - s;
  if (s > 0u && cum < P.G && cum + s >= P.G) {
    for (var i = 0u; i < 256u; i++) {
      let x = hist[row + top - i];
      if (x == 0u) { continue; }
      if (cum + x >= P.G) {
        found[0] = top - i;
        found[1] = cum;
        break;
      }
      cum += x;
    }
  }
  workgroupBarrier();
  if (lid != 0u) { return; }
  if (P.phase == 0u) {
    if (found[0] == 0xffffffffu) { cut[h] = Cut(2u, 0u, 0u, 0u); } else { cut[h] = Cut(1u, found[0], found[1], 0u); }
  } else {
    cut[h] = Cut(1u, c.hi, c.above, (c.hi << 16u) | found[0]);
  }
}
`;
  return { name: 'peFind', cacheKey: 'peFind', wgsl, entryPoint: 'main' };
}

/**
 * The kept entries as block rows over every head, one thread per row (h, I): mode 0 writes
 * each row's count at rowPtr[r + 1] (scanProgram then makes the offsets), mode 1 the kept J
 * in order at rowPtr[r]. VS heads and inactive rows keep nothing.
 */
export function peRowsProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { H: u32, Nb: u32, B: u32, firstPos: u32, n: u32, rowWidth: u32, mode: u32, p0: u32 }
${CUT_STRUCT}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> routes: array<u32>;
@group(0) @binding(2) var<storage, read> map: array<u32>;
@group(0) @binding(3) var<storage, read> cut: array<Cut>;
@group(0) @binding(4) var<storage, read_write> rowPtr: array<u32>;
@group(0) @binding(5) var<storage, read_write> cols: array<u32>;
${ROW_ACTIVE}@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let r = gid.x + gid.y * P.rowWidth;
  if (r >= P.H * P.Nb) { return; }
  let h = r / P.Nb;
  let I = r % P.Nb;
  var count = 0u;
  if (routes[h] == 0u && rowActive(I)) {
    let c = cut[h];
    let keepAll = c.state == 2u;
    let base = h * (P.Nb * (P.Nb + 1u) / 2u) + I * (I + 1u) / 2u;
    var at = 0u;
    if (P.mode == 1u) { at = rowPtr[r]; }
    for (var J = 0u; J <= I; J++) {
      if (keepAll || map[base + J] >= c.T) {
        if (P.mode == 1u) { cols[at + count] = J; }
        count++;
      }
    }
  }
  if (P.mode == 0u) {
    rowPtr[r + 1u] = count;
    if (r == 0u) { rowPtr[0] = 0u; }
  }
}
`;
  return { name: 'peRows', cacheKey: 'peRows', wgsl, entryPoint: 'main' };
}
