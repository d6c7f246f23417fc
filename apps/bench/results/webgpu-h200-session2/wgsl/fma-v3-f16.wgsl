
struct Params {
  m: u32, n: u32, H: u32, Hkv: u32,
  B: u32, Nb: u32, dense: u32, headBase: u32,
  firstTile: u32, numTiles: u32, returnLse: u32, scaleLog2: f32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> K: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> V: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> O: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read_write> LSE: array<u32>; // f32 bits; -inf for empty rows
@group(0) @binding(6) var<storage, read> rowPtr: array<u32>;
@group(0) @binding(7) var<storage, read> cols: array<u32>;

const D: u32 = 128u;
const D4: u32 = 32u;
const MASKED: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
// P of the current key tile, transposed: [key][row group of 4].
var<workgroup> Ps: array<vec4<f32>, 1024>;
// Staging area, two buffers of 512 vec4: a Q chunk [16 dims][64 rows] at +0 and a K chunk
// at +256, or a V chunk [16 keys][d]. Buffer 0's first 256 also hold the row partials
// (max per tile, sums and the NaN flag at the end) while buffer 1 holds the last Q/K
// chunk; W[1023] passes the key-tile range to every thread.
var<workgroup> W: array<vec4<f32>, 1024>;

fn nonFinite(x: vec4<f32>) -> bool {
  return any((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) == vec4<u32>(0x7f800000u));
}

// Two u32 (< 2^30) through an f32 slot: bit 30 set keeps the pattern a normal float, so no
// flush-to-zero of denormals can touch it on the way.
fn packU2(v: vec2<u32>) -> vec4<f32> { return bitcast<vec4<f32>>(vec4<u32>(v | vec2<u32>(0x40000000u), 0x40000000u, 0x40000000u)); }
fn unpackU2(f: vec4<f32>) -> vec2<u32> { return bitcast<vec4<u32>>(f).xy & vec2<u32>(0x3fffffffu); }

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let tr = lid / 16u;
  let tc = lid % 16u;
  let h = P.headBase + wid.y;
  let g = h / (P.H / P.Hkv);
  // Heaviest tiles (most keys) first: better tail balance on causal work.
  let t = P.firstTile + P.numTiles - 1u - wid.x;
  let q0 = t * 64u;
  let rowOff = P.n - P.m;
  var o0_0 = vec4<f32>(0.0); var o0_1 = vec4<f32>(0.0);
  var o1_0 = vec4<f32>(0.0); var o1_1 = vec4<f32>(0.0);
  var o2_0 = vec4<f32>(0.0); var o2_1 = vec4<f32>(0.0);
  var o3_0 = vec4<f32>(0.0); var o3_1 = vec4<f32>(0.0);
  var o4_0 = vec4<f32>(0.0); var o4_1 = vec4<f32>(0.0);
  var o5_0 = vec4<f32>(0.0); var o5_1 = vec4<f32>(0.0);
  var o6_0 = vec4<f32>(0.0); var o6_1 = vec4<f32>(0.0);
  var o7_0 = vec4<f32>(0.0); var o7_1 = vec4<f32>(0.0);
  var mlo = vec4<f32>(-1.0e30); var mhi = vec4<f32>(-1.0e30); // running max, rows tr*8 + 0..3 / 4..7
  var llo = vec4<f32>(0.0); var lhi = vec4<f32>(0.0);          // this thread's partial row sums
  var bad = false;
  let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    var sgr = vec2<u32>(0u, 1u);
    if (P.dense == 0u) { sgr = vec2<u32>(rowPtr[h * P.Nb + I], rowPtr[h * P.Nb + I + 1u]); }
    W[1023] = packU2(sgr);
  }
  let sg = unpackU2(workgroupUniformLoad(&W[1023]));
  for (var si = sg.x; si < sg.y; si++) {
    // every thread has finished the previous segment (and read W[1023]) before it is reused
    workgroupBarrier();
    if (lid == 0u) {
      var kr0 = vec2<u32>(0u, t + 1u);
      if (P.dense == 0u) { let J = cols[si]; kr0 = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
      W[1023] = packU2(kr0);
    }
    let kr = unpackU2(workgroupUniformLoad(&W[1023]));
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0); var s4 = vec4<f32>(0.0); var s5 = vec4<f32>(0.0); var s6 = vec4<f32>(0.0); var s7 = vec4<f32>(0.0);
      for (var ci = 0u; ci < 8u; ci++) {
        let dc = ci * 16u;
        {
        let qb2 = (ci % 2u) * 512u;
        for (var e = 0u; e < 2u; e++) {
          let x = lid + e * 128u;
          let row = x / 4u;
          let dg = x % 4u;
          let lpos = q0 + row;
          var qv = vec4<f32>(0.0);
          if (lpos >= rowOff && lpos < P.n) { let qRow = lpos - rowOff; qv = vec4<f32>(unpack2x16float((Q[((qRow * P.H + h) * D + dc + dg * 4u) / 4u]).x), unpack2x16float((Q[((qRow * P.H + h) * D + dc + dg * 4u) / 4u]).y)) * P.scaleLog2; }
          let kp = k0 + row;
          var kv = vec4<f32>(0.0);
          if (kp < P.n) { kv = vec4<f32>(unpack2x16float((K[((kp * P.Hkv + g) * D + dc + dg * 4u) / 4u]).x), unpack2x16float((K[((kp * P.Hkv + g) * D + dc + dg * 4u) / 4u]).y)); }
          bad = bad | nonFinite(qv) | nonFinite(kv);
          let at = qb2 + dg * 64u + row / 4u;
          let cc = row % 4u;
          W[at][cc] = qv.x; W[at + 16u][cc] = qv.y; W[at + 32u][cc] = qv.z; W[at + 48u][cc] = qv.w;
          W[at + 256u][cc] = kv.x; W[at + 272u][cc] = kv.y; W[at + 288u][cc] = kv.z; W[at + 304u][cc] = kv.w;
        }
      }
        workgroupBarrier();
        let qb = (ci % 2u) * 512u;
        {
        let a0 = W[qb + 0u * 16u + tr * 2u]; let a1 = W[qb + 0u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 0u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 1u * 16u + tr * 2u]; let a1 = W[qb + 1u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 1u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 2u * 16u + tr * 2u]; let a1 = W[qb + 2u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 2u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 3u * 16u + tr * 2u]; let a1 = W[qb + 3u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 3u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 4u * 16u + tr * 2u]; let a1 = W[qb + 4u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 4u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 5u * 16u + tr * 2u]; let a1 = W[qb + 5u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 5u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 6u * 16u + tr * 2u]; let a1 = W[qb + 6u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 6u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 7u * 16u + tr * 2u]; let a1 = W[qb + 7u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 7u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 8u * 16u + tr * 2u]; let a1 = W[qb + 8u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 8u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 9u * 16u + tr * 2u]; let a1 = W[qb + 9u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 9u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 10u * 16u + tr * 2u]; let a1 = W[qb + 10u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 10u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 11u * 16u + tr * 2u]; let a1 = W[qb + 11u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 11u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 12u * 16u + tr * 2u]; let a1 = W[qb + 12u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 12u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 13u * 16u + tr * 2u]; let a1 = W[qb + 13u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 13u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 14u * 16u + tr * 2u]; let a1 = W[qb + 14u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 14u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      {
        let a0 = W[qb + 15u * 16u + tr * 2u]; let a1 = W[qb + 15u * 16u + tr * 2u + 1u]; let bb = W[qb + 256u + 15u * 16u + tc];
        s0 += a0.x * bb; s1 += a0.y * bb; s2 += a0.z * bb; s3 += a0.w * bb; s4 += a1.x * bb; s5 += a1.y * bb; s6 += a1.z * bb; s7 += a1.w * bb;
      }
      }
      if (kt == t || k0 + 64u > P.n) {
          let kv4 = vec4<u32>(k0 + tc * 4u) + vec4<u32>(0u, 1u, 2u, 3u);
          let outside = kv4 >= vec4<u32>(P.n);
          s0 = select(s0, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 0u)) | outside);
          s1 = select(s1, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 1u)) | outside);
          s2 = select(s2, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 2u)) | outside);
          s3 = select(s3, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 3u)) | outside);
          s4 = select(s4, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 4u)) | outside);
          s5 = select(s5, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 5u)) | outside);
          s6 = select(s6, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 6u)) | outside);
          s7 = select(s7, vec4<f32>(MASKED), (kv4 > vec4<u32>(q0 + tr * 8u + 7u)) | outside);
      }
      // Row maxima: 16 partials per row into buffer 0 (idle: the last chunk used buffer 1).
      W[(tr * 8u + 0u) * 4u + tc / 4u][tc % 4u] = max(max(s0.x, s0.y), max(s0.z, s0.w));
      W[(tr * 8u + 1u) * 4u + tc / 4u][tc % 4u] = max(max(s1.x, s1.y), max(s1.z, s1.w));
      W[(tr * 8u + 2u) * 4u + tc / 4u][tc % 4u] = max(max(s2.x, s2.y), max(s2.z, s2.w));
      W[(tr * 8u + 3u) * 4u + tc / 4u][tc % 4u] = max(max(s3.x, s3.y), max(s3.z, s3.w));
      W[(tr * 8u + 4u) * 4u + tc / 4u][tc % 4u] = max(max(s4.x, s4.y), max(s4.z, s4.w));
      W[(tr * 8u + 5u) * 4u + tc / 4u][tc % 4u] = max(max(s5.x, s5.y), max(s5.z, s5.w));
      W[(tr * 8u + 6u) * 4u + tc / 4u][tc % 4u] = max(max(s6.x, s6.y), max(s6.z, s6.w));
      W[(tr * 8u + 7u) * 4u + tc / 4u][tc % 4u] = max(max(s7.x, s7.y), max(s7.z, s7.w));
      workgroupBarrier();
      var tlo = mlo;
      var thi = mhi;
      for (var c = 0u; c < 4u; c++) {
        { let r = W[(tr * 8u + 0u) * 4u + c]; tlo.x = max(tlo.x, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 1u) * 4u + c]; tlo.y = max(tlo.y, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 2u) * 4u + c]; tlo.z = max(tlo.z, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 3u) * 4u + c]; tlo.w = max(tlo.w, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 4u) * 4u + c]; thi.x = max(thi.x, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 5u) * 4u + c]; thi.y = max(thi.y, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 6u) * 4u + c]; thi.z = max(thi.z, max(max(r.x, r.y), max(r.z, r.w))); }
        { let r = W[(tr * 8u + 7u) * 4u + c]; thi.w = max(thi.w, max(max(r.x, r.y), max(r.z, r.w))); }
      }
      let alo = exp2(mlo - tlo);
      let ahi = exp2(mhi - thi);
      mlo = tlo;
      mhi = thi;
      let p0 = exp2(s0 - tlo.x); let p1 = exp2(s1 - tlo.y); let p2 = exp2(s2 - tlo.z); let p3 = exp2(s3 - tlo.w); let p4 = exp2(s4 - thi.x); let p5 = exp2(s5 - thi.y); let p6 = exp2(s6 - thi.z); let p7 = exp2(s7 - thi.w);
      let one = vec4<f32>(1.0);
      llo = llo * alo + vec4<f32>(dot(p0, one), dot(p1, one), dot(p2, one), dot(p3, one));
      lhi = lhi * ahi + vec4<f32>(dot(p4, one), dot(p5, one), dot(p6, one), dot(p7, one));
      Ps[(tc * 4u + 0u) * 16u + tr * 2u] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
      Ps[(tc * 4u + 0u) * 16u + tr * 2u + 1u] = vec4<f32>(p4.x, p5.x, p6.x, p7.x);
      Ps[(tc * 4u + 1u) * 16u + tr * 2u] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
      Ps[(tc * 4u + 1u) * 16u + tr * 2u + 1u] = vec4<f32>(p4.y, p5.y, p6.y, p7.y);
      Ps[(tc * 4u + 2u) * 16u + tr * 2u] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
      Ps[(tc * 4u + 2u) * 16u + tr * 2u + 1u] = vec4<f32>(p4.z, p5.z, p6.z, p7.z);
      Ps[(tc * 4u + 3u) * 16u + tr * 2u] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
      Ps[(tc * 4u + 3u) * 16u + tr * 2u + 1u] = vec4<f32>(p4.w, p5.w, p6.w, p7.w);
      o0_0 *= alo.x; o0_1 *= alo.x;
      o1_0 *= alo.y; o1_1 *= alo.y;
      o2_0 *= alo.z; o2_1 *= alo.z;
      o3_0 *= alo.w; o3_1 *= alo.w;
      o4_0 *= ahi.x; o4_1 *= ahi.x;
      o5_0 *= ahi.y; o5_1 *= ahi.y;
      o6_0 *= ahi.z; o6_1 *= ahi.z;
      o7_0 *= ahi.w; o7_1 *= ahi.w;
      // P complete, and everyone is past reading the partials in buffer 0.
      workgroupBarrier();
      for (var vc = 0u; vc < 64u; vc += 16u) {
        let vb = ((vc / 16u) % 2u) * 512u;
        
          for (var x = lid; x < 512u; x += 128u) {
            let kp = k0 + vc + x / D4;
            var vv = vec4<f32>(0.0);
            if (kp < P.n) { vv = vec4<f32>(unpack2x16float((V[((kp * P.Hkv + g) * D) / 4u + x % D4]).x), unpack2x16float((V[((kp * P.Hkv + g) * D) / 4u + x % D4]).y)); }
            bad = bad | nonFinite(vv);
            W[vb + x] = vv;
          }
        workgroupBarrier();
        {
          let p0 = Ps[(vc + 0u) * 16u + tr * 2u]; let p1 = Ps[(vc + 0u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 0u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 0u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 1u) * 16u + tr * 2u]; let p1 = Ps[(vc + 1u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 1u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 1u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 2u) * 16u + tr * 2u]; let p1 = Ps[(vc + 2u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 2u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 2u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 3u) * 16u + tr * 2u]; let p1 = Ps[(vc + 3u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 3u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 3u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 4u) * 16u + tr * 2u]; let p1 = Ps[(vc + 4u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 4u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 4u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 5u) * 16u + tr * 2u]; let p1 = Ps[(vc + 5u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 5u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 5u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 6u) * 16u + tr * 2u]; let p1 = Ps[(vc + 6u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 6u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 6u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 7u) * 16u + tr * 2u]; let p1 = Ps[(vc + 7u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 7u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 7u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 8u) * 16u + tr * 2u]; let p1 = Ps[(vc + 8u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 8u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 8u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 9u) * 16u + tr * 2u]; let p1 = Ps[(vc + 9u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 9u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 9u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 10u) * 16u + tr * 2u]; let p1 = Ps[(vc + 10u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 10u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 10u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 11u) * 16u + tr * 2u]; let p1 = Ps[(vc + 11u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 11u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 11u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 12u) * 16u + tr * 2u]; let p1 = Ps[(vc + 12u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 12u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 12u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 13u) * 16u + tr * 2u]; let p1 = Ps[(vc + 13u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 13u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 13u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 14u) * 16u + tr * 2u]; let p1 = Ps[(vc + 14u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 14u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 14u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
        {
          let p0 = Ps[(vc + 15u) * 16u + tr * 2u]; let p1 = Ps[(vc + 15u) * 16u + tr * 2u + 1u];
          { let vv = W[vb + 15u * 32u + 0u + tc];
            o0_0 += p0.x * vv; o1_0 += p0.y * vv; o2_0 += p0.z * vv; o3_0 += p0.w * vv; o4_0 += p1.x * vv; o5_0 += p1.y * vv; o6_0 += p1.z * vv; o7_0 += p1.w * vv; }
          { let vv = W[vb + 15u * 32u + 16u + tc];
            o0_1 += p0.x * vv; o1_1 += p0.y * vv; o2_1 += p0.z * vv; o3_1 += p0.w * vv; o4_1 += p1.x * vv; o5_1 += p1.y * vv; o6_1 += p1.z * vv; o7_1 += p1.w * vv; }
        }
      }
    }
  }
  // Row sums and the NaN/Inf flag through buffer 0 (buffer 1 held the last V chunk).
  workgroupBarrier();
  W[(tr * 8u + 0u) * 4u + tc / 4u][tc % 4u] = llo.x;
  W[(tr * 8u + 1u) * 4u + tc / 4u][tc % 4u] = llo.y;
  W[(tr * 8u + 2u) * 4u + tc / 4u][tc % 4u] = llo.z;
  W[(tr * 8u + 3u) * 4u + tc / 4u][tc % 4u] = llo.w;
  W[(tr * 8u + 4u) * 4u + tc / 4u][tc % 4u] = lhi.x;
  W[(tr * 8u + 5u) * 4u + tc / 4u][tc % 4u] = lhi.y;
  W[(tr * 8u + 6u) * 4u + tc / 4u][tc % 4u] = lhi.z;
  W[(tr * 8u + 7u) * 4u + tc / 4u][tc % 4u] = lhi.w;
  W[256u + lid / 4u][lid % 4u] = select(0.0, 1.0, bad);
  workgroupBarrier();
  var anyBad = 0.0;
  for (var c = 0u; c < 32u; c++) { anyBad = max(anyBad, dot(W[256u + c], vec4<f32>(1.0))); }
  // NaN/Inf in the inputs must not come out as a finite answer: poison this tile's rows.
  let poisoned = anyBad > 0.0;
  let poison = bitcast<f32>(select(0u, 0x7fc00000u, poisoned));
  llo = vec4<f32>(0.0);
  lhi = vec4<f32>(0.0);
  for (var c = 0u; c < 4u; c++) {
    { let r = W[(tr * 8u + 0u) * 4u + c]; llo.x += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 1u) * 4u + c]; llo.y += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 2u) * 4u + c]; llo.z += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 3u) * 4u + c]; llo.w += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 4u) * 4u + c]; lhi.x += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 5u) * 4u + c]; lhi.y += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 6u) * 4u + c]; lhi.z += dot(r, vec4<f32>(1.0)); }
    { let r = W[(tr * 8u + 7u) * 4u + c]; lhi.w += dot(r, vec4<f32>(1.0)); }
  }
  {
    let pos = q0 + tr * 8u + 0u;
    let L = llo.x;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o0_0 * inv).xy), pack2x16float((o0_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o0_1 * inv).xy), pack2x16float((o0_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mlo.x + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 1u;
    let L = llo.y;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o1_0 * inv).xy), pack2x16float((o1_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o1_1 * inv).xy), pack2x16float((o1_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mlo.y + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 2u;
    let L = llo.z;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o2_0 * inv).xy), pack2x16float((o2_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o2_1 * inv).xy), pack2x16float((o2_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mlo.z + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 3u;
    let L = llo.w;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o3_0 * inv).xy), pack2x16float((o3_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o3_1 * inv).xy), pack2x16float((o3_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mlo.w + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 4u;
    let L = lhi.x;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o4_0 * inv).xy), pack2x16float((o4_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o4_1 * inv).xy), pack2x16float((o4_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mhi.x + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 5u;
    let L = lhi.y;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o5_0 * inv).xy), pack2x16float((o5_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o5_1 * inv).xy), pack2x16float((o5_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mhi.y + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 6u;
    let L = lhi.z;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o6_0 * inv).xy), pack2x16float((o6_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o6_1 * inv).xy), pack2x16float((o6_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mhi.z + log2(L)) * LN2), L > 0.0);
      }
    }
  }
  {
    let pos = q0 + tr * 8u + 7u;
    let L = lhi.w;
    if (pos >= rowOff && pos < P.n) {
      let row = pos - rowOff;
      let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, poisoned);
      let obase = ((row * P.H + h) * D) / 4u;
      O[obase + 0u + tc] = vec2<u32>(pack2x16float((o7_0 * inv).xy), pack2x16float((o7_0 * inv).zw)); O[obase + 16u + tc] = vec2<u32>(pack2x16float((o7_1 * inv).xy), pack2x16float((o7_1 * inv).zw));
      if (P.returnLse == 1u && tc == 0u) {
        LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mhi.w + log2(L)) * LN2), L > 0.0);
      }
    }
  }
}
