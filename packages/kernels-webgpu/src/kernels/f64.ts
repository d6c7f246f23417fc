/**
 * Binary64 arithmetic in WGSL (which has no f64), on integers only, for the rules whose
 * device form must give the host's f64 results bit for bit: the noise floor's threshold
 * α · (max(1 − p[0] − p[Nb−1], 0) / (Nb − 2)) (@crisp/select's meanBackground, evaluated left
 * to right as JavaScript does). Every operation is the exact result rounded once to nearest,
 * ties to even (IEEE 754 binary64, subnormals and overflow included), as in Berkeley
 * SoftFloat: the significands carry guard bits and a sticky bit, so one final rounding gives
 * the correctly rounded value. No float instruction touches the values, so no
 * flush-to-zero or fused operation of a driver can change them.
 *
 * u64 values are vec2<u32>(hi, lo). An exact intermediate is (sign, e, m): (−1)^sign · m · 2^e
 * with m a u64. f64 and f32 values travel as their bit patterns.
 */
export const F64_WGSL = /* wgsl */ `
fn u64Add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let lo = a.y + b.y;
  return vec2<u32>(a.x + b.x + select(0u, 1u, lo < a.y), lo);
}
fn u64Sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  return vec2<u32>(a.x - b.x - select(0u, 1u, a.y < b.y), a.y - b.y);
}
fn u64Less(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }
fn u64IsZero(a: vec2<u32>) -> bool { return a.x == 0u && a.y == 0u; }
// (WGSL shifts use the low 5 bits of the amount: every case below keeps it in 0..31)
fn u64Shl(a: vec2<u32>, k: u32) -> vec2<u32> {
  if (k == 0u) { return a; }
  if (k >= 64u) { return vec2<u32>(0u, 0u); }
  if (k >= 32u) { return vec2<u32>(a.y << (k - 32u), 0u); }
  return vec2<u32>((a.x << k) | (a.y >> (32u - k)), a.y << k);
}
fn u64Shr(a: vec2<u32>, k: u32) -> vec2<u32> {
  if (k == 0u) { return a; }
  if (k >= 64u) { return vec2<u32>(0u, 0u); }
  if (k >= 32u) { return vec2<u32>(0u, a.x >> (k - 32u)); }
  return vec2<u32>(a.x >> k, (a.y >> k) | (a.x << (32u - k)));
}
// a >> k with the lost bits ORed into bit 0 (the sticky bit)
fn u64ShrJam(a: vec2<u32>, k: u32) -> vec2<u32> {
  let r = u64Shr(a, k);
  let lost = any(u64Shl(r, k) != a) || (k >= 64u && !u64IsZero(a));
  return vec2<u32>(r.x, r.y | select(0u, 1u, lost));
}
fn u64Clz(a: vec2<u32>) -> u32 {
  if (a.x != 0u) { return countLeadingZeros(a.x); }
  return 32u + countLeadingZeros(a.y);
}
// the 64-bit product of two u32
fn mul32(a: u32, b: u32) -> vec2<u32> {
  let al = a & 0xffffu; let ah = a >> 16u; let bl = b & 0xffffu; let bh = b >> 16u;
  let p0 = al * bl; let p1 = al * bh; let p2 = ah * bl; let p3 = ah * bh;
  let mid = p1 + p2;
  let midCarry = select(0u, 0x10000u, mid < p1);
  let lo = p0 + (mid << 16u);
  return vec2<u32>(p3 + (mid >> 16u) + midCarry + select(0u, 1u, lo < p0), lo);
}

struct Exact { sign: u32, e: i32, m: vec2<u32> }

// f64 bits as (sign, e, m), m < 2^53 (finite values)
fn f64Unpack(b: vec2<u32>) -> Exact {
  let E = (b.x >> 20u) & 0x7ffu;
  var m = vec2<u32>(b.x & 0xfffffu, b.y);
  if (E == 0u) { return Exact(b.x >> 31u, -1074, m); }
  m.x |= 0x100000u;
  return Exact(b.x >> 31u, i32(E) - 1075, m);
}
// f32 bits as (sign, e, m), m < 2^24 (finite values)
fn f32Unpack(b: u32) -> Exact {
  let E = (b >> 23u) & 0xffu;
  let m = b & 0x7fffffu;
  if (E == 0u) { return Exact(b >> 31u, -149, vec2<u32>(0u, m)); }
  return Exact(b >> 31u, i32(E) - 150, vec2<u32>(0u, m | 0x800000u));
}
// (sign, e, m) rounded to f64 bits, to nearest, ties to even. Bits of m below the rounding
// point stand for the exact value's; bit 0 may be a sticky bit when at least two bits of m
// are below the rounding point (every caller leaves ten or more).
fn f64Round(sign: u32, e0: i32, m0: vec2<u32>) -> vec2<u32> {
  let s = sign << 31u;
  if (u64IsZero(m0)) { return vec2<u32>(s, 0u); }
  let z = u64Clz(m0);
  let m = u64Shl(m0, z);
  let e = e0 - i32(z);
  // the value is m · 2^e with m's top bit at 63; the result's quantum is 2^q
  let q = max(e + 11, -1074);
  if (q + 1074 >= 2047) { return vec2<u32>(s | 0x7ff00000u, 0u); }
  let k = u32(q - e);
  var r = vec2<u32>(0u, 0u);
  var half = false;
  var rest = false;
  if (k <= 63u) {
    r = u64Shr(m, k);
    let below = u64Sub(m, u64Shl(r, k));
    let h = u64Shl(vec2<u32>(0u, 1u), k - 1u);
    half = !u64Less(below, h);
    rest = any(u64Sub(below, select(vec2<u32>(0u, 0u), h, half)) != vec2<u32>(0u, 0u));
  } else if (k == 64u) {
    half = true;
    rest = any(u64Sub(m, vec2<u32>(0x80000000u, 0u)) != vec2<u32>(0u, 0u));
  }
  if (half && (rest || (r.y & 1u) == 1u)) { r = u64Add(r, vec2<u32>(0u, 1u)); }
  // r in [2^52, 2^53] for a normal result (2^53: the carry into the exponent), below 2^52
  // for a subnormal one: the exponent field is q + 1074 plus r's bit 52
  let bits = u64Add(vec2<u32>(u32(q + 1074) << 20u, 0u), r);
  if (bits.x >= 0x7ff00000u) { return vec2<u32>(s | 0x7ff00000u, 0u); }
  return vec2<u32>(s | bits.x, bits.y);
}
// an exact value with m normalised to its top bit at 61 (m != 0)
fn at61(x: Exact) -> Exact {
  let z = i32(u64Clz(x.m)) - 2;
  if (z >= 0) { return Exact(x.sign, x.e - z, u64Shl(x.m, u32(z))); }
  return Exact(x.sign, x.e - z, u64ShrJam(x.m, u32(-z)));
}
// fl(x + y) for finite x, y
fn f64AddExact(x0: Exact, y0: Exact) -> vec2<u32> {
  if (u64IsZero(x0.m) && u64IsZero(y0.m)) { return vec2<u32>((x0.sign & y0.sign) << 31u, 0u); }
  if (u64IsZero(y0.m)) { return f64Round(x0.sign, x0.e, x0.m); }
  if (u64IsZero(x0.m)) { return f64Round(y0.sign, y0.e, y0.m); }
  var x = at61(x0);
  var y = at61(y0);
  if (y.e > x.e) { let t = x; x = y; y = t; }
  // (x and y are exact: at most 53 significant bits moved to bit 61)
  let ym = u64ShrJam(y.m, u32(min(x.e - y.e, 64)));
  if (x.sign == y.sign) { return f64Round(x.sign, x.e, u64Add(x.m, ym)); }
  if (u64Less(x.m, ym)) { return f64Round(y.sign, x.e, u64Sub(ym, x.m)); }
  // an exact zero difference is +0 (round to nearest)
  if (all(x.m == ym)) { return vec2<u32>(0u, 0u); }
  return f64Round(x.sign, x.e, u64Sub(x.m, ym));
}
// fl(x / d) for finite x and an integer 1 <= d < 2^31: long division to a quotient of 62 or
// 63 bits, the remainder as the sticky bit
fn f64DivInt(x0: Exact, d: u32) -> vec2<u32> {
  if (u64IsZero(x0.m)) { return vec2<u32>(x0.sign << 31u, 0u); }
  let z = u64Clz(x0.m);
  let m = u64Shl(x0.m, z - 11u);  // top bit at 52
  let e = x0.e - i32(z - 11u);
  let L = 32u - countLeadingZeros(d);
  let k = 10u + L;                 // quotient of m · 2^k / d in [2^62, 2^64)
  var q = vec2<u32>(0u, 0u);
  var r = 0u;
  for (var i = 0u; i < 53u + k; i++) {
    var bit = 0u;
    if (i < 53u) { bit = u64Shr(m, 52u - i).y & 1u; }
    r = (r << 1u) | bit;
    q = u64Shl(q, 1u);
    if (r >= d) { r -= d; q.y |= 1u; }
  }
  q.y |= select(0u, 1u, r != 0u);
  return f64Round(x0.sign, e - i32(k), q);
}
// fl(x · y) for finite x, y: the 106-bit product, its top 64 bits and a sticky bit
fn f64MulExact(x0: Exact, y0: Exact) -> vec2<u32> {
  let sign = x0.sign ^ y0.sign;
  if (u64IsZero(x0.m) || u64IsZero(y0.m)) { return vec2<u32>(sign << 31u, 0u); }
  let zx = u64Clz(x0.m) - 11u;
  let zy = u64Clz(y0.m) - 11u;
  let a = u64Shl(x0.m, zx);
  let b = u64Shl(y0.m, zy);
  // words w3 w2 w1 w0 of a · b (a, b < 2^53)
  let p00 = mul32(a.y, b.y);
  let p01 = mul32(a.y, b.x);
  let p10 = mul32(a.x, b.y);
  let p11 = mul32(a.x, b.x);
  let w0 = p00.y;
  var midLo = u64Add(vec2<u32>(0u, p00.x), vec2<u32>(0u, p01.y));
  midLo = u64Add(midLo, vec2<u32>(0u, p10.y));
  let w1 = midLo.y;
  var hi = u64Add(p11, vec2<u32>(0u, p01.x));
  hi = u64Add(hi, vec2<u32>(0u, p10.x));
  hi = u64Add(hi, vec2<u32>(0u, midLo.x));  // (w3, w2)
  // product >> 42, the lost bits sticky (the product is in [2^104, 2^106))
  var top = u64Shl(hi, 22u);
  top.y |= w1 >> 10u;
  top.y |= select(0u, 1u, (w1 & 0x3ffu) != 0u || w0 != 0u);
  return f64Round(sign, x0.e + y0.e - i32(zx) - i32(zy) + 42, top);
}
// order keys: u < v as keys iff the values compare so (+0 and −0 one key; finite values)
fn f64Key(b: vec2<u32>) -> vec2<u32> {
  if ((b.x & 0x7fffffffu) == 0u && b.y == 0u) { return vec2<u32>(0x80000000u, 0u); }
  if ((b.x >> 31u) == 1u) { return vec2<u32>(~b.x, ~b.y); }
  return vec2<u32>(b.x | 0x80000000u, b.y);
}
fn f32Key(b: u32) -> u32 {
  if ((b & 0x7fffffffu) == 0u) { return 0x80000000u; }
  if ((b >> 31u) == 1u) { return ~b; }
  return b | 0x80000000u;
}
// f32 bits as f64 bits (exact)
fn f32ToF64(b: u32) -> vec2<u32> {
  let x = f32Unpack(b);
  return f64Round(x.sign, x.e, x.m);
}
// the residual mass 1 − a − b in f64, as JavaScript evaluates it: a, b f32 bits
fn residualMass(a: u32, b: u32) -> vec2<u32> {
  let one = Exact(0u, 0, vec2<u32>(0u, 1u));
  var na = f32Unpack(a); na.sign ^= 1u;
  var nb = f32Unpack(b); nb.sign ^= 1u;
  let t1 = f64AddExact(one, na);
  return f64AddExact(f64Unpack(t1), nb);
}
// the noise floor's threshold α · (max(1 − a − b, 0) / (Nb − 2)) in f64, as JavaScript
// evaluates it: a, b f32 bits, α f64 bits, Nb >= 3
fn noiseFloorThreshold(a: u32, b: u32, alpha: vec2<u32>, Nb: u32) -> vec2<u32> {
  let t2 = residualMass(a, b);
  // Math.max(t2, 0): +0 unless t2 > 0
  var m = vec2<u32>(0u, 0u);
  if ((t2.x >> 31u) == 0u && !u64IsZero(t2)) { m = t2; }
  let mu = f64DivInt(f64Unpack(m), Nb - 2u);
  return f64MulExact(f64Unpack(alpha), f64Unpack(mu));
}
`;
