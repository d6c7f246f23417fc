
struct Params {
  m: u32, n: u32, H: u32, Hkv: u32,
  B: u32, Nb: u32, dense: u32, headBase: u32,
  firstTile: u32, numTiles: u32, returnLse: u32, scaleLog2: f32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> O: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> LSE: array<u32>; // f32 bits; -inf for empty rows
@group(0) @binding(6) var<storage, read> rowPtr: array<u32>;
@group(0) @binding(7) var<storage, read> cols: array<u32>;

const D: u32 = 128u;
const MASKED: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
var<workgroup> QK: array<vec4<f32>, 512>;
// set when a loaded q, k or v value is NaN or Inf: the kernel then poisons what it writes
var<workgroup> badInput: atomic<u32>;
fn nonFinite(x: vec4<f32>) -> bool {
  return any((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) == vec4<u32>(0x7f800000u));
}
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
  let h = P.headBase + wid.y;
  let g = h / (P.H / P.Hkv);
  // Heaviest tiles (most keys) first: better tail balance on causal work.
  let t = P.firstTile + P.numTiles - 1u - wid.x;
  let q0 = t * 64u;
  let rowOff = P.n - P.m;
  let lpos = q0 + lr;
  let qValidL = lpos >= rowOff && lpos < P.n;
  let qRowL = select(0u, lpos - rowOff, qValidL);
  var o0_0 = vec4<f32>(0.0);
  var o0_1 = vec4<f32>(0.0);
  var o1_0 = vec4<f32>(0.0);
  var o1_1 = vec4<f32>(0.0);
  var o2_0 = vec4<f32>(0.0);
  var o2_1 = vec4<f32>(0.0);
  var o3_0 = vec4<f32>(0.0);
  var o3_1 = vec4<f32>(0.0);
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
      
    var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
    for (var dc = 0u; dc < 128u; dc += 16u) {
      var qv = vec4<f32>(0.0);
      if (qValidL) { qv = Q[((qRowL * P.H + h) * D + dc + ld) / 4u] * P.scaleLog2; }
      let kposL = k0 + lr;
      var kv = vec4<f32>(0.0);
      if (kposL < P.n) { kv = K[((kposL * P.Hkv + g) * D + dc + ld) / 4u]; }
      if (nonFinite(qv) || nonFinite(kv)) { atomicStore(&badInput, 1u); }
      let qa = ld * 16u + lr / 4u;
      let qc = lr % 4u;
      QK[qa][qc] = qv.x; QK[qa + 16u][qc] = qv.y; QK[qa + 32u][qc] = qv.z; QK[qa + 48u][qc] = qv.w;
      QK[256u + qa][qc] = kv.x; QK[256u + qa + 16u][qc] = kv.y; QK[256u + qa + 32u][qc] = kv.z; QK[256u + qa + 48u][qc] = kv.w;
      workgroupBarrier();
      { let a = QK[0u + tr]; let b = QK[256u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[16u + tr]; let b = QK[272u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[32u + tr]; let b = QK[288u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[48u + tr]; let b = QK[304u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[64u + tr]; let b = QK[320u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[80u + tr]; let b = QK[336u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[96u + tr]; let b = QK[352u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[112u + tr]; let b = QK[368u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[128u + tr]; let b = QK[384u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[144u + tr]; let b = QK[400u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[160u + tr]; let b = QK[416u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[176u + tr]; let b = QK[432u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[192u + tr]; let b = QK[448u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[208u + tr]; let b = QK[464u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[224u + tr]; let b = QK[480u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      { let a = QK[240u + tr]; let b = QK[496u + tc];
        s0 += a.x * b; s1 += a.y * b; s2 += a.z * b; s3 += a.w * b; }
      workgroupBarrier();
    }
      if (kt == t || k0 + 64u > P.n) {
        if (k0 + tc * 4u + 0u > q0 + tr * 4u + 0u || k0 + tc * 4u + 0u >= P.n) { s0.x = MASKED; }
        if (k0 + tc * 4u + 1u > q0 + tr * 4u + 0u || k0 + tc * 4u + 1u >= P.n) { s0.y = MASKED; }
        if (k0 + tc * 4u + 2u > q0 + tr * 4u + 0u || k0 + tc * 4u + 2u >= P.n) { s0.z = MASKED; }
        if (k0 + tc * 4u + 3u > q0 + tr * 4u + 0u || k0 + tc * 4u + 3u >= P.n) { s0.w = MASKED; }
        if (k0 + tc * 4u + 0u > q0 + tr * 4u + 1u || k0 + tc * 4u + 0u >= P.n) { s1.x = MASKED; }
        if (k0 + tc * 4u + 1u > q0 + tr * 4u + 1u || k0 + tc * 4u + 1u >= P.n) { s1.y = MASKED; }
        if (k0 + tc * 4u + 2u > q0 + tr * 4u + 1u || k0 + tc * 4u + 2u >= P.n) { s1.z = MASKED; }
        if (k0 + tc * 4u + 3u > q0 + tr * 4u + 1u || k0 + tc * 4u + 3u >= P.n) { s1.w = MASKED; }
        if (k0 + tc * 4u + 0u > q0 + tr * 4u + 2u || k0 + tc * 4u + 0u >= P.n) { s2.x = MASKED; }
        if (k0 + tc * 4u + 1u > q0 + tr * 4u + 2u || k0 + tc * 4u + 1u >= P.n) { s2.y = MASKED; }
        if (k0 + tc * 4u + 2u > q0 + tr * 4u + 2u || k0 + tc * 4u + 2u >= P.n) { s2.z = MASKED; }
        if (k0 + tc * 4u + 3u > q0 + tr * 4u + 2u || k0 + tc * 4u + 3u >= P.n) { s2.w = MASKED; }
        if (k0 + tc * 4u + 0u > q0 + tr * 4u + 3u || k0 + tc * 4u + 0u >= P.n) { s3.x = MASKED; }
        if (k0 + tc * 4u + 1u > q0 + tr * 4u + 3u || k0 + tc * 4u + 1u >= P.n) { s3.y = MASKED; }
        if (k0 + tc * 4u + 2u > q0 + tr * 4u + 3u || k0 + tc * 4u + 2u >= P.n) { s3.z = MASKED; }
        if (k0 + tc * 4u + 3u > q0 + tr * 4u + 3u || k0 + tc * 4u + 3u >= P.n) { s3.w = MASKED; }
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
      o0_0 *= alpha.x;
      o0_1 *= alpha.x;
      o1_0 *= alpha.y;
      o1_1 *= alpha.y;
      o2_0 *= alpha.z;
      o2_1 *= alpha.z;
      o3_0 *= alpha.w;
      o3_1 *= alpha.w;
      for (var vc = 0u; vc < 64u; vc += 16u) {
        for (var x = lid; x < 512u; x += 256u) {
          let kpos = k0 + vc + x / 32u;
          var vv = vec4<f32>(0.0);
          if (kpos < P.n) { vv = V[((kpos * P.Hkv + g) * D) / 4u + x % 32u]; }
          if (nonFinite(vv)) { atomicStore(&badInput, 1u); }
          QK[x] = vv;
        }
        workgroupBarrier();
        for (var c = 0u; c < 16u; c++) {
          let pv = Ps[(vc + c) * 16u + tr];
          { let vv = QK[c * 32u + 0u + tc];
            o0_0 += pv.x * vv;
            o1_0 += pv.y * vv;
            o2_0 += pv.z * vv;
            o3_0 += pv.w * vv;
          }
          { let vv = QK[c * 32u + 16u + tc];
            o0_1 += pv.x * vv;
            o1_1 += pv.y * vv;
            o2_1 += pv.z * vv;
            o3_1 += pv.w * vv;
          }
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
  {
      let pos = q0 + tr * 4u + 0u;
      let L = lsum.x;
      if (pos >= rowOff && pos < P.n) {
        let row = pos - rowOff;
        let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, bad);
        let obase = ((row * P.H + h) * D) / 4u;
        O[obase + 0u + tc] = o0_0 * inv;
        O[obase + 16u + tc] = o0_1 * inv;
        if (P.returnLse == 1u && tc == 0u) {
          LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mrow.x + log2(L)) * LN2), L > 0.0);
        }
      }
    }
  {
      let pos = q0 + tr * 4u + 1u;
      let L = lsum.y;
      if (pos >= rowOff && pos < P.n) {
        let row = pos - rowOff;
        let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, bad);
        let obase = ((row * P.H + h) * D) / 4u;
        O[obase + 0u + tc] = o1_0 * inv;
        O[obase + 16u + tc] = o1_1 * inv;
        if (P.returnLse == 1u && tc == 0u) {
          LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mrow.y + log2(L)) * LN2), L > 0.0);
        }
      }
    }
  {
      let pos = q0 + tr * 4u + 2u;
      let L = lsum.z;
      if (pos >= rowOff && pos < P.n) {
        let row = pos - rowOff;
        let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, bad);
        let obase = ((row * P.H + h) * D) / 4u;
        O[obase + 0u + tc] = o2_0 * inv;
        O[obase + 16u + tc] = o2_1 * inv;
        if (P.returnLse == 1u && tc == 0u) {
          LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mrow.z + log2(L)) * LN2), L > 0.0);
        }
      }
    }
  {
      let pos = q0 + tr * 4u + 3u;
      let L = lsum.w;
      if (pos >= rowOff && pos < P.n) {
        let row = pos - rowOff;
        let inv = select(select(0.0, 1.0 / L, L > 0.0), poison, bad);
        let obase = ((row * P.H + h) * D) / 4u;
        O[obase + 0u + tc] = o3_0 * inv;
        O[obase + 16u + tc] = o3_1 * inv;
        if (P.returnLse == 1u && tc == 0u) {
          LSE[h * P.m + row] = select(0xff800000u, bitcast<u32>((mrow.w + log2(L)) * LN2), L > 0.0);
        }
      }
    }
}
