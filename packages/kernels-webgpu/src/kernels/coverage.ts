/**
 * FlexPrefill's cumulative coverage on the device (core's DeviceCoverageRule, offered for
 * γ <= 0.99), a part of the selection program (./select.ts):
 *
 *   count  = #{ tokens of the descending-sorted prefix whose sum stays <= γ } + 1
 *   blocks = floor(count / B) + 1, clipped to [kBlocks, Nb]; block 0 and the blocks − 1 best others
 *
 * as @crisp/select's cumulativeCoverage computes it in f64. The count is a radix select over the
 * token scores' f32 patterns, 8 bits a step (for non-negative floats the pattern's order is the
 * value's), with each score's mass added as an integer in units of 2^-52. A score >= 2^-29 is
 * such an integer exactly, and every sum of them below 2 is an f64 the host's running sum
 * meets exactly, so the count is the host's whatever order the GPU adds in. The scores below
 * 2^-29 count as 0: they hold under 2^-9 of a softmax row's mass at n <= 2^20, so for
 * γ <= 0.99 the running sum passes γ before them.
 *
 * Each thread adds its run of equal digits into the histogram once (strided tokens mostly
 * share a digit), so the atomics stay few where the scores crowd into one binade.
 *
 * Shape legend: n keys; tokV, tokS [H][n] f32 the vertical and slash token scores.
 */
import type { ProgramDescriptor } from './common.js';
import { F64_WGSL } from './f64.js';

/**
 * floor(γ · 2^52) as (hi, lo) u32: a running sum S of masses in units of 2^-52 stays <= γ iff
 * S <= this (S is an integer).
 */
export function coverageLimit(gamma: number): [number, number] {
  const g = Math.floor(gamma * 2 ** 52);
  return [Math.floor(g / 2 ** 32), g % 2 ** 32];
}

/**
 * WGSL: `coverageCount(h, dir, lid) -> u32` (call from every thread of the workgroup, in
 * uniform control flow), reading `tokV` / `tokS` and `P.n`, `P.gHi`, `P.gLo`; needs F64_WGSL.
 */
export const COVERAGE_WGSL = /* wgsl */ `
var<workgroup> hCount: array<atomic<u32>, 256>;
var<workgroup> hLo: array<atomic<u32>, 256>;
var<workgroup> hHi: array<atomic<u32>, 256>;
// (decided pattern prefix, tokens above it, their mass hi, lo)
var<workgroup> covState: vec4<u32>;
var<workgroup> covDone: u32;
var<workgroup> covResult: u32;

fn tokenBits(dir: u32, i: u32) -> u32 {
  if (dir == 0u) { return bitcast<u32>(tokV[i]); }
  return bitcast<u32>(tokS[i]);
}
// a score's mass in units of 2^-52: exact from 2^-29 up; 0 below, and for a negative, Inf or NaN pattern
fn massUnits(x: u32) -> vec2<u32> {
  if (x < 0x31000000u || x >= 0x7f800000u) { return vec2<u32>(0u, 0u); }
  let m = (x & 0x7fffffu) | 0x800000u;
  return u64Shl(vec2<u32>(0u, m), min((x >> 23u) - 98u, 31u));
}
fn addBin(d: u32, c: u32, m: vec2<u32>) {
  if (c == 0u) { return; }
  atomicAdd(&hCount[d], c);
  let old = atomicAdd(&hLo[d], m.y);
  atomicAdd(&hHi[d], m.x + select(0u, 1u, old + m.y < old));
}
// u · j for a u64 u and a u32 j (no overflow in the uses here: below 2^60)
fn mulU64(u: vec2<u32>, j: u32) -> vec2<u32> {
  let lo = mul32(u.y, j);
  return vec2<u32>(lo.x + u.x * j, lo.y);
}

fn coverageCount(h: u32, dir: u32, lid: u32) -> u32 {
  let n = P.n;
  let base = h * n;
  let G = vec2<u32>(P.gHi, P.gLo);
  if (lid == 0u) {
    covState = vec4<u32>(0u, 0u, 0u, 0u);
    covDone = 0u;
  }
  for (var step = 0u; step < 4u; step++) {
    // (thread 0 has read the last step's histogram)
    workgroupBarrier();
    atomicStore(&hCount[lid], 0u);
    atomicStore(&hLo[lid], 0u);
    atomicStore(&hHi[lid], 0u);
    let st = workgroupUniformLoad(&covState);
    if (workgroupUniformLoad(&covDone) == 1u) { break; }
    let shift = 24u - 8u * step;
    var cd = 0u;
    var cc = 0u;
    var cm = vec2<u32>(0u, 0u);
    for (var j = lid; j < n; j += 256u) {
      let x = tokenBits(dir, base + j);
      // (the first step takes every pattern; later ones those under the decided prefix)
      if (step == 0u || (x >> (shift + 8u)) == st.x) {
        let d = (x >> shift) & 255u;
        if (d != cd) {
          addBin(cd, cc, cm);
          cd = d;
          cc = 0u;
          cm = vec2<u32>(0u, 0u);
        }
        cc++;
        cm = u64Add(cm, massUnits(x));
      }
    }
    addBin(cd, cc, cm);
    workgroupBarrier();
    if (lid == 0u) {
      var above = st.zw;
      var cnt = st.y;
      var cross = -1;
      for (var d = 255; d >= 0; d--) {
        let next = u64Add(above, vec2<u32>(atomicLoad(&hHi[d]), atomicLoad(&hLo[d])));
        if (u64Less(G, next)) {
          cross = d;
          break;
        }
        above = next;
        cnt += atomicLoad(&hCount[d]);
      }
      if (cross < 0) {
        // every remaining token fits under γ
        covDone = 1u;
        covResult = cnt + 1u;
      } else if (step == 3u) {
        // one pattern v, c copies, crossing: j copies fit (j < c), the largest j with above + j u <= G
        let v = (st.x << 8u) | u32(cross);
        let u = massUnits(v);
        var lo = 0u;
        var hi = atomicLoad(&hCount[cross]);
        while (hi - lo > 1u) {
          let mid = (lo + hi) / 2u;
          if (u64Less(G, u64Add(above, mulU64(u, mid)))) { hi = mid; } else { lo = mid; }
        }
        covResult = cnt + lo + 1u;
      } else {
        covState = vec4<u32>((st.x << 8u) | u32(cross), cnt, above.x, above.y);
      }
    }
  }
  return workgroupUniformLoad(&covResult);
}
`;

/**
 * A test program: coverageCount over token scores. Grid (2 directions, H heads), 256 threads;
 * out [2][H] the counts.
 */
export function coverageProbeProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `${F64_WGSL}
struct Params { n: u32, gHi: u32, gLo: u32, H: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> tokV: array<f32>;
@group(0) @binding(2) var<storage, read> tokS: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
${COVERAGE_WGSL}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let c = coverageCount(wid.y, wid.x, lid);
  if (lid == 0u) { out[wid.x * P.H + wid.y] = c; }
}
`;
  return { name: 'coverageProbe', cacheKey: 'coverageProbe', wgsl, entryPoint: 'main' };
}
