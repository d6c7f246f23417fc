/**
 * The residual test of @crisp/router's residualJsd on the device (core's DeviceRouterRule), for
 * crispGuarded's plan: head h goes to PE iff r = 1 − p_v[0] − p_v[Nb−1] >= minResidual and the
 * Jensen-Shannon distance between the pooled estimate ā and p_v over blocks 1..Nb−2 (both
 * renormalised) is < τ. With Nb < 3, r <= 0 or an undefined distance the head stays on VS (the
 * host's distance is then sqrt(ln 2), above every τ the router takes).
 *
 * - r is computed in binary64 on integers (./f64.ts), as JavaScript evaluates it, so the mass
 *   test is the host's bit for bit.
 * - ā is the softmax of the statistics' pooled logits in f32, and the distance is f32 too:
 *   JSD = ½ Σ_J t_J · φ(u_J), t = a + b, u = (a − b) / t, φ(u) = ½[(1+u) ln(1+u) + (1−u) ln(1−u)],
 *   which is a ln(2a/t) + b ln(2b/t) over t. Every term is >= 0, so the sum has no cancellation,
 *   and φ comes from its series Σ_k u^{2k} / (2k(2k−1)) where u² <= 1/4 (where the logarithms
 *   would cancel). The distance then agrees with the host's f64 one to about 1e-6; a head
 *   within WEBGPU_PLAN_MARGIN of τ may be routed either way (core: DevicePlanner.margin).
 * - ā [H][Nb] is written for the selection, whose PE lists' narrowing (Policy.peVsExcess)
 *   compares p_v[J] with κ · ā[J] (./select.ts).
 * - `full`: FlexPrefill's jsd router instead, PE iff the distance over every block is < τ (no
 *   residual mass test; core's jsDistance), with the same arithmetic and margin.
 *
 * Shape legend: H heads, Nb blocks; sums [H][Nb + 1][2] f32 as proxyStats writes them
 * (vertical, slash; C_struct in the vertical slot of entry Nb).
 */
import type { ProgramDescriptor } from './common.js';
import { F64_WGSL } from './f64.js';

/**
 * How far from τ a residual distance, and how far from 1 the ratio p_v / (κ ā) of a narrowed
 * block, must lie for the device's f32 decision to be the host's f64 one (DevicePlanner.margin).
 * The distance's error is about 1e-6 (see the header); the ratio's a few f32 roundings.
 */
export const WEBGPU_PLAN_MARGIN = 1e-4;

/**
 * Grid (H), 256 threads. src [H][Nb] f32: the pooled logits (fromLogits 1) or ā itself (0);
 * pooled [H][Nb] f32 gets ā; out [H] vec4 gets (PE by the residual test 1 / 0, r in f32,
 * the distance, 0).
 */
export function residualRouteProgram(): ProgramDescriptor {
  const wgsl = /* wgsl */ `${F64_WGSL}
struct Params { H: u32, Nb: u32, fromLogits: u32, full: u32, tau: f32, minHi: u32, minLo: u32, p1: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> sums: array<u32>;  // f32 bits
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read_write> pooled: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
var<workgroup> red: array<f32, 256>;
var<workgroup> go: u32;
var<workgroup> resid: f32;
const UNDEFINED: f32 = 0.8325546111576977; // sqrt(ln 2)

fn pvBits(h: u32, J: u32) -> u32 { return sums[(h * (P.Nb + 1u) + J) * 2u]; }

// (called by every thread: the reduction's barriers)
fn wgSum(lid: u32, x: f32) -> f32 {
  red[lid] = x;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] += red[lid + s]; }
    workgroupBarrier();
  }
  let r = workgroupUniformLoad(&red[0]);
  workgroupBarrier();
  return r;
}
fn wgMax(lid: u32, x: f32) -> f32 {
  red[lid] = x;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  let r = workgroupUniformLoad(&red[0]);
  workgroupBarrier();
  return r;
}

// ā[J] from src[J]: e_J / z, or src[J] itself
fn abar(x: f32, mx: f32, z: f32) -> f32 { return select(x, exp(x - mx) / z, P.fromLogits == 1u); }

// φ(u) = ½[(1+u) ln(1+u) + (1−u) ln(1−u)] for u = (a − b) / t, t = a + b > 0
fn phi(a: f32, b: f32, t: f32) -> f32 {
  let u = (a - b) / t;
  let v = u * u;
  if (v <= 0.25) {
    var s = 1.0 / 552.0;
    s = 1.0 / 462.0 + v * s;
    s = 1.0 / 380.0 + v * s;
    s = 1.0 / 306.0 + v * s;
    s = 1.0 / 240.0 + v * s;
    s = 1.0 / 182.0 + v * s;
    s = 1.0 / 132.0 + v * s;
    s = 1.0 / 90.0 + v * s;
    s = 1.0 / 56.0 + v * s;
    s = 1.0 / 30.0 + v * s;
    s = 1.0 / 12.0 + v * s;
    s = 0.5 + v * s;
    return v * s;
  }
  // 1 + |u| and 1 − |u| without the cancellation of 1 − |u|
  let x = 2.0 * max(a, b) / t;
  let y = 2.0 * min(a, b) / t;
  var r = x * log(x);
  if (y > 0.0) { r += y * log(y); }
  return 0.5 * r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let Nb = P.Nb;
  let base = h * Nb;
  // ā = softmax of the logits: e_J / z
  var mx = 0.0;
  var z = 1.0;
  if (P.fromLogits == 1u) {
    var m = -3.0e38;
    for (var J = lid; J < Nb; J += 256u) { m = max(m, src[base + J]); }
    mx = wgMax(lid, m);
    var s = 0.0;
    for (var J = lid; J < Nb; J += 256u) { s += exp(src[base + J] - mx); }
    z = wgSum(lid, s);
  }
  for (var J = lid; J < Nb; J += 256u) {
    let x = src[base + J];
    pooled[base + J] = abar(x, mx, z);
  }
  // the blocks the distance runs over: 1..Nb−2 (residual), every block (full)
  let J0 = select(1u, 0u, P.full == 1u);
  let J1 = select(Nb - 1u, Nb, P.full == 1u);
  if (lid == 0u) {
    go = select(0u, 1u, P.full == 1u);
    resid = 0.0;
    if (P.full == 0u && Nb >= 3u) {
      let r = residualMass(pvBits(h, 0u), pvBits(h, Nb - 1u));
      let k = f64Key(r);
      let km = f64Key(vec2<u32>(P.minHi, P.minLo));
      let positive = (r.x >> 31u) == 0u && !u64IsZero(r);
      let atLeast = km.x < k.x || (km.x == k.x && km.y <= k.y);
      go = select(0u, 1u, positive && atLeast);
      resid = 1.0 - bitcast<f32>(pvBits(h, 0u)) - bitcast<f32>(pvBits(h, Nb - 1u));
    }
  }
  var dist = UNDEFINED;
  let test = workgroupUniformLoad(&go);
  if (test == 1u) {
    var sa = 0.0;
    var sp = 0.0;
    var neg = 0.0;
    for (var J = J0 + lid; J < J1; J += 256u) {
      let x = src[base + J];
      sa += abar(x, mx, z);
      let p = bitcast<f32>(pvBits(h, J));
      sp += p;
      if (p < 0.0 || (x < 0.0 && P.fromLogits == 0u)) { neg = 1.0; }
    }
    sa = wgSum(lid, sa);
    sp = wgSum(lid, sp);
    neg = wgMax(lid, neg);
    if (sa > 0.0 && sp > 0.0 && neg == 0.0) {
      var acc = 0.0;
      for (var J = J0 + lid; J < J1; J += 256u) {
        let x = src[base + J];
        let a = abar(x, mx, z) / sa;
        let b = bitcast<f32>(pvBits(h, J)) / sp;
        let t = a + b;
        if (t > 0.0) { acc += t * phi(a, b, t); }
      }
      dist = sqrt(max(0.0, 0.5 * wgSum(lid, acc)));
    }
  }
  if (lid == 0u) {
    let pe = test == 1u && dist < P.tau;
    out[h] = vec4<f32>(select(0.0, 1.0, pe), resid, dist, 0.0);
  }
}
`;
  return { name: 'residualRoute', cacheKey: 'residualRoute', wgsl, entryPoint: 'main' };
}
