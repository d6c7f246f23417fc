/**
 * Routing and VS selection on the device, the device forms of @crisp/router's cStruct rule
 * and @crisp/select's noise floor (core's DeviceRouterRule / DeviceSelectorRule), exact:
 *   cStruct:    head h goes to VS iff C_struct[h] >= τ. C_struct is an f32 here; the host
 *               passes the order key of the smallest f32 >= τ (f32 x >= τ iff x >= that
 *               f32), and the kernel compares order keys of the bits (NaN goes to PE).
 *   residual:   with a residual test (./route-residual.ts, `res`: residualJsd's or jsd's), a
 *               head it sends to PE goes to PE whatever C_struct says (core's anyPe).
 *   coverage:   with `coverage`, VS heads (and PE heads' lists with peWithVs) keep block 0
 *               and the best others by FlexPrefill's cumulative coverage of the token scores
 *               (./coverage.ts) instead of the noise floor.
 *   noiseFloor: VS heads keep {J : p[J] > α μ} ∪ {0, Nb − 1}, the kBlocks best when fewer
 *               pass (both ends counted if they pass), every block when Nb <= 2; PE heads
 *               the peK best of each direction, ∪ {0}. With peWithVs PE heads keep the floor's
 *               lists too (at their own α, Policy.peVs), and with a narrowing
 *               (Policy.peVsExcess) a PE head outside the band of C_struct
 *               (Policy.peVsFullAnchor) keeps of them only the vertical blocks with
 *               p_v[J] > κ · ā[J] (in f32: core's DevicePlanner.margin) and no slash list.
 *               The threshold
 *               is the host's f64 value bit for bit (./f64.ts), p[J] is widened to f64
 *               exactly, and the comparison is one of order keys.
 * "Best": higher score first, ties toward the lower index, on order keys of the f32 bits
 * (the host compares the same f32 values in f64: the same order).
 *
 * Shape legend: H heads, Nb blocks; sums [H][Nb + 1][2] f32 as proxyStats' block sums pass
 * writes them (vertical, slash per block; C_struct in the vertical slot of entry Nb).
 */
import { type ProgramDescriptor, workgroupInclusiveScan } from './common.js';
import { COVERAGE_WGSL } from './coverage.js';
import { F64_WGSL } from './f64.js';

/** The most blocks a head may have here (the selection's bitmap in workgroup memory). */
export const SELECT_MAX_BLOCKS = 65536;

/**
 * Grid (2 directions, H heads), 256 threads. lists [2][H][Nb]: the selected blocks ascending;
 * counts [2][H]; routes [H] (1 = VS, 0 = PE), written by direction 0. res [H] vec4 (x: 1 where
 * the residual test sends the head to PE) and pooled [H][Nb] (ā) from ./route-residual.ts,
 * read when `residual` and `narrow` say so. Band keys: f32 order keys of the smallest f32 >=
 * from and >= below (from 0xffffffff and below 0: no band). tokV, tokS [H][n]: the token scores
 * the coverage rule reads (one-word stand-ins without it); gHi, gLo: coverageLimit(γ).
 */
export function vsSelectProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `${F64_WGSL}
struct Params {
  H: u32, Nb: u32, kBlocks: u32, peK: u32, tauKey: u32, alphaHi: u32, alphaLo: u32, residual: u32,
  peWithVs: u32, peAlphaHi: u32, peAlphaLo: u32, narrow: u32, excess: f32, fromKey: u32, belowKey: u32, coverage: u32,
  n: u32, B: u32, gHi: u32, gLo: u32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> sums: array<u32>;  // f32 bits
@group(0) @binding(2) var<storage, read_write> lists: array<u32>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
@group(0) @binding(4) var<storage, read_write> routes: array<u32>;
@group(0) @binding(5) var<storage, read> res: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> pooled: array<f32>;
@group(0) @binding(7) var<storage, read> tokV: array<f32>;
@group(0) @binding(8) var<storage, read> tokS: array<f32>;
${COVERAGE_WGSL}
var<workgroup> bits: array<atomic<u32>, ${SELECT_MAX_BLOCKS / 32}>;
var<workgroup> passed: atomic<u32>;
var<workgroup> isVs: u32;
var<workgroup> floorOn: u32;
var<workgroup> narrowed: u32;
var<workgroup> fallback: u32;
var<workgroup> th: vec2<u32>;
var<workgroup> redKey: array<u32, 256>;
var<workgroup> redIdx: array<u32, 256>;
var<workgroup> runs: array<u32, 256>;

fn score(h: u32, dir: u32, J: u32) -> u32 { return sums[((h * (P.Nb + 1u)) + J) * 2u + dir]; }
fn setBit(J: u32) { atomicOr(&bits[J >> 5u], 1u << (J & 31u)); }
// (key k, index i) ranks before (key l, index j)
fn before(k: u32, i: u32, l: u32, j: u32) -> bool { return k > l || (k == l && i < j); }

// the k best blocks (k < Nb; block 0 left out with skip0) into the bitmap: one workgroup
// argmax a round, each round the best block ranked after the last winner
fn topK(h: u32, dir: u32, k: u32, lid: u32, skip0: bool) {
  var pk = 0xffffffffu;
  var pi = 0xffffffffu;   // (the first round: every block ranks after this)
  var first = true;
  for (var r = 0u; r < k; r++) {
    var bk = 0u;
    var bi = 0xffffffffu;  // none
    for (var J = lid; J < P.Nb; J += 256u) {
      let v = f32Key(score(h, dir, J));
      if ((!skip0 || J != 0u) && (first || before(pk, pi, v, J)) && (bi == 0xffffffffu || before(v, J, bk, bi))) { bk = v; bi = J; }
    }
    redKey[lid] = bk;
    redIdx[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
      if (lid < s) {
        let oi = redIdx[lid + s];
        if (oi != 0xffffffffu && (redIdx[lid] == 0xffffffffu || before(redKey[lid + s], oi, redKey[lid], redIdx[lid]))) {
          redKey[lid] = redKey[lid + s];
          redIdx[lid] = oi;
        }
      }
      workgroupBarrier();
    }
    pk = redKey[0];
    pi = redIdx[0];
    first = false;
    if (lid == 0u && pi != 0xffffffffu) { setBit(pi); }
    workgroupBarrier();
  }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let dir = wid.x;
  let h = wid.y;
  let Nb = P.Nb;
  let words = (Nb + 31u) >> 5u;
  for (var w = lid; w < words; w += 256u) { atomicStore(&bits[w], 0u); }
  if (lid == 0u) {
    atomicStore(&passed, 0u);
    let c = sums[(h * (Nb + 1u) + Nb) * 2u];
    let nan = (c & 0x7f800000u) == 0x7f800000u && (c & 0x7fffffu) != 0u;
    let residualPe = P.residual == 1u && res[h].x != 0.0;
    isVs = select(0u, 1u, !nan && f32Key(c) >= P.tauKey && !residualPe);
    if (dir == 0u) { routes[h] = isVs; }
    let inBand = !nan && f32Key(c) >= P.fromKey && f32Key(c) < P.belowKey;
    narrowed = select(0u, 1u, isVs == 0u && P.narrow == 1u && !inBand);
    // the floor: VS heads' lists, and with peWithVs a PE head's (a narrowed one's vertical only)
    floorOn = select(0u, 1u, isVs == 1u || (P.peWithVs == 1u && !(narrowed == 1u && dir == 1u)));
    if (floorOn == 1u && Nb > 2u) {
      let alpha = select(vec2<u32>(P.peAlphaHi, P.peAlphaLo), vec2<u32>(P.alphaHi, P.alphaLo), isVs == 1u);
      th = f64Key(noiseFloorThreshold(score(h, dir, 0u), score(h, dir, Nb - 1u), alpha, Nb));
    }
  }
  let vs = workgroupUniformLoad(&isVs);
  let ruleOn = workgroupUniformLoad(&floorOn);
  if (ruleOn == 1u && P.coverage == 1u) {
    // FlexPrefill's cumulative coverage: block 0 and the blocks − 1 best others
    let count = coverageCount(h, dir, lid);
    let blocks = min(Nb, max(P.kBlocks, count / P.B + 1u));
    if (blocks >= Nb) {
      for (var J = lid; J < Nb; J += 256u) { setBit(J); }
    } else if (blocks > 1u) {
      topK(h, dir, blocks - 1u, lid, true);
    }
    workgroupBarrier();
    if (lid == 0u) { setBit(0u); }
  } else if (ruleOn == 1u) {
    if (Nb <= 2u) {
      if (lid < Nb) { setBit(lid); }
    } else {
      let t = th;
      for (var J = lid; J < Nb; J += 256u) {
        let k = f64Key(f32ToF64(score(h, dir, J)));
        if (t.x < k.x || (t.x == k.x && t.y < k.y)) {
          if (J != 0u && J != Nb - 1u) { setBit(J); }
          atomicAdd(&passed, 1u);
        }
      }
      workgroupBarrier();
      if (lid == 0u) { fallback = select(0u, 1u, atomicLoad(&passed) < P.kBlocks); }
      if (workgroupUniformLoad(&fallback) == 1u) {
        for (var w = lid; w < words; w += 256u) { atomicStore(&bits[w], 0u); }
        workgroupBarrier();
        if (P.kBlocks >= Nb) {
          for (var J = lid; J < Nb; J += 256u) { setBit(J); }
        } else {
          topK(h, dir, P.kBlocks, lid, false);
        }
      }
      workgroupBarrier();
      if (lid == 0u) { setBit(0u); setBit(Nb - 1u); }
    }
  }
  if (vs == 0u) {
    if (workgroupUniformLoad(&narrowed) == 1u && dir == 0u) {
      // only the blocks the pooled map under-reads: p_v[J] > κ · ā[J] (the floor's bits set first)
      workgroupBarrier();
      for (var J = lid; J < Nb; J += 256u) {
        if ((atomicLoad(&bits[J >> 5u]) & (1u << (J & 31u))) != 0u && !(bitcast<f32>(score(h, 0u, J)) > P.excess * pooled[h * Nb + J])) {
          atomicAnd(&bits[J >> 5u], ~(1u << (J & 31u)));
        }
      }
      workgroupBarrier();
    }
    if (P.peK >= Nb) {
      for (var J = lid; J < Nb; J += 256u) { setBit(J); }
    } else if (P.peK > 0u) {
      topK(h, dir, P.peK, lid, false);
    }
    workgroupBarrier();
    if (lid == 0u) { setBit(0u); }
  }
  workgroupBarrier();
  // compact in index order: thread lid owns words [w0, w1)
  let per = (words + 255u) / 256u;
  let w0 = min(lid * per, words);
  let w1 = min(w0 + per, words);
  var own = 0u;
  for (var w = w0; w < w1; w++) { own += countOneBits(atomicLoad(&bits[w])); }
  runs[lid] = own;
  workgroupBarrier();
  ${workgroupInclusiveScan('runs')}
  var at = runs[lid] - own;
  let base = (dir * P.H + h) * Nb;
  for (var w = w0; w < w1; w++) {
    var b = atomicLoad(&bits[w]);
    while (b != 0u) {
      let j = countTrailingZeros(b);
      b &= b - 1u;
      lists[base + at] = w * 32u + j;
      at++;
    }
  }
  if (lid == 255u) { counts[dir * P.H + h] = runs[255]; }
}
`;
  return { name: 'vsSelect', cacheKey: 'vsSelect', wgsl, entryPoint: 'main' };
}

/**
 * The selected lists in expandCount's form: vsPtr [vertical H + 1][slash H + 1] (exclusive
 * sums of the counts in head order), vsList vertical lists from 0, slash lists from H · Nb.
 * Grid (2, H), 64 threads.
 */
export function vsPackProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `
struct Params { H: u32, Nb: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> lists: array<u32>;
@group(0) @binding(2) var<storage, read> counts: array<u32>;
@group(0) @binding(3) var<storage, read_write> vsPtr: array<u32>;
@group(0) @binding(4) var<storage, read_write> vsList: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let dir = wid.x;
  let h = wid.y;
  var off = 0u;
  for (var g = 0u; g < h; g++) { off += counts[dir * P.H + g]; }
  let c = counts[dir * P.H + h];
  if (lid == 0u) {
    if (h == 0u) { vsPtr[dir * (P.H + 1u)] = 0u; }
    vsPtr[dir * (P.H + 1u) + h + 1u] = off + c;
  }
  let src = (dir * P.H + h) * P.Nb;
  let dst = dir * P.H * P.Nb + off;
  for (var i = lid; i < c; i += 64u) { vsList[dst + i] = lists[src + i]; }
}
`;
  return { name: 'vsPack', cacheKey: 'vsPack', wgsl, entryPoint: 'main' };
}

/**
 * A test program: noiseFloorThreshold over arrays of inputs. inputs [N][5] u32: a, b (f32
 * bits), α (f64 bits hi, lo), Nb; out [N][2] the f64 bits (hi, lo).
 */
export function thresholdProbeProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `${F64_WGSL}
@group(0) @binding(0) var<storage, read> inputs: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= arrayLength(&out) / 2u) { return; }
  let r = noiseFloorThreshold(inputs[i * 5u], inputs[i * 5u + 1u], vec2<u32>(inputs[i * 5u + 2u], inputs[i * 5u + 3u]), inputs[i * 5u + 4u]);
  out[i * 2u] = r.x;
  out[i * 2u + 1u] = r.y;
}
`;
  return { name: 'thresholdProbe', cacheKey: 'thresholdProbe', wgsl, entryPoint: 'main' };
}
