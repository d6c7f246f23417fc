
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
struct Params {
  m: u32, n: u32, H: u32, Hkv: u32,
  B: u32, Nb: u32, dense: u32, headBase: u32,
  firstTile: u32, numTiles: u32, returnLse: u32, scaleLog2: f32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f16>;
@group(0) @binding(2) var<storage, read> K: array<u32>;
@group(0) @binding(3) var<storage, read> V: array<u32>;
@group(0) @binding(4) var<storage, read_write> O: array<f16>;
@group(0) @binding(5) var<storage, read_write> LSE: array<u32>;
@group(0) @binding(6) var<storage, read> rowPtr: array<u32>;
@group(0) @binding(7) var<storage, read> cols: array<u32>;

const D: u32 = 128u;
const LN2: f32 = 0.6931471805599453;
var<workgroup> Ssh: array<f32, 4096>;  // per subgroup [16 rows][64 keys] scores, then O staging
var<workgroup> Psh: array<f16, 4096>;  // per subgroup [16 rows][64 keys] probabilities
var<workgroup> KVs: array<f16, 8192>; // the K or V tile [64 keys][d]
var<workgroup> parts: array<vec2<f32>, 128>; // per (row, half): (max, sum) partials
var<workgroup> seg: vec2<u32>;
var<workgroup> tiles: vec2<u32>;

@compute @workgroup_size(128)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
  @builtin(subgroup_id) sgid: u32,
  @builtin(subgroup_invocation_id) lane: u32,
) {
  // Fragment offsets must be uniform for the matrix builtins: subgroup_id is (per
  // subgroup), lid / 32 is not, and Tint rejected the kernel built on it.
  let sg = sgid;
  let r = lane / 2u;          // this thread's row within the subgroup's 16
  let hc = lane % 2u;         // which 32 of the tile's 64 keys it reduces
  let h = P.headBase + wid.y;
  let g = h / (P.H / P.Hkv);
  let t = P.firstTile + P.numTiles - 1u - wid.x;
  let q0 = t * 64u;
  let rowOff = P.n - P.m;
  // Fragment rows: 16 consecutive q rows, clamped into the tensor (chunked prefill and
  // short m); only rows inside this subgroup's slice of the tile are written.
  let qb = u32(clamp(i32(q0 + sg * 16u) - i32(rowOff), 0, max(i32(P.m) - 16, 0)));
  let qBase = (qb * P.H + h) * D;
  let pos = rowOff + qb + r;
  let qRow = qb + r;
  let rowOk = pos >= q0 + sg * 16u && pos < q0 + sg * 16u + 16u && pos < P.n;
  let qf0 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 0u, false, P.H * D);
  let qf1 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 16u, false, P.H * D);
  let qf2 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 32u, false, P.H * D);
  let qf3 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 48u, false, P.H * D);
  let qf4 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 64u, false, P.H * D);
  let qf5 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 80u, false, P.H * D);
  let qf6 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 96u, false, P.H * D);
  let qf7 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Q, qBase + 112u, false, P.H * D);
  let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    if (P.dense == 1u) { seg = vec2<u32>(0u, 1u); }
    else { seg = vec2<u32>(rowPtr[h * P.Nb + I], rowPtr[h * P.Nb + I + 1u]); }
  }
  let sg2 = workgroupUniformLoad(&seg);

  // Pass 1: row max M and normaliser L (base 2, scale folded in).
  var m = -1.0e30;
  var l = 0.0;
  
  for (var si = sg2.x; si < sg2.y; si++) {
    if (lid == 0u) {
      if (P.dense == 1u) { tiles = vec2<u32>(0u, t + 1u); }
      else { let J = cols[si]; tiles = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
    }
    let kr = workgroupUniformLoad(&tiles);
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      let kBase = (k0 * P.Hkv + g) * D;
      
      for (var x = lid; x < 4096u; x += 128u) {
        let kp = k0 + x / 64u;
        var w = 0u;
        if (kp < P.n) { w = K[((kp * P.Hkv + g) * D) / 2u + x % 64u]; }
        let hv = bitcast<vec2<f16>>(w);
        KVs[2u * x] = hv.x;
        KVs[2u * x + 1u] = hv.y;
      }
      workgroupBarrier();
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 0u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 16u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 32u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 48u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 64u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 80u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 96u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 112u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 0u, acc, false, 64u);
      }
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2048u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2064u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2080u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2096u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2112u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2128u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2144u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2160u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 16u, acc, false, 64u);
      }
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4096u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4112u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4128u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4144u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4160u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4176u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4192u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4208u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 32u, acc, false, 64u);
      }
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6144u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6160u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6176u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6192u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6208u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6224u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6240u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6256u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 48u, acc, false, 64u);
      }
      workgroupBarrier();
      var tmx = m;
      for (var c = 0u; c < 32u; c++) {
        let kp = k0 + hc * 32u + c;
        if (kp <= pos && kp < P.n) { tmx = max(tmx, Ssh[sg * 1024u + r * 64u + hc * 32u + c] * P.scaleLog2); }
      }
      var acc = 0.0;
      for (var c = 0u; c < 32u; c++) {
        let kp = k0 + hc * 32u + c;
        if (kp <= pos && kp < P.n) { acc += exp2(Ssh[sg * 1024u + r * 64u + hc * 32u + c] * P.scaleLog2 - tmx); }
      }
      l = l * exp2(m - tmx) + acc;
      m = tmx;
      workgroupBarrier();
    }
    workgroupBarrier();
  }
  parts[sg * 32u + lane] = vec2<f32>(m, l);
  workgroupBarrier();
  let other = parts[sg * 32u + (lane ^ 1u)];
  let M = max(m, other.x);
  let L = l * exp2(m - M) + other.y * exp2(other.x - M);
  let invL = select(0.0, 1.0 / L, L > 0.0);
  workgroupBarrier();

  // Pass 2: O = Σ P V with P already normalised, so the accumulators never need rescaling.
  var o0 = subgroup_matrix_result<f32, 16, 16>();
  var o1 = subgroup_matrix_result<f32, 16, 16>();
  var o2 = subgroup_matrix_result<f32, 16, 16>();
  var o3 = subgroup_matrix_result<f32, 16, 16>();
  var o4 = subgroup_matrix_result<f32, 16, 16>();
  var o5 = subgroup_matrix_result<f32, 16, 16>();
  var o6 = subgroup_matrix_result<f32, 16, 16>();
  var o7 = subgroup_matrix_result<f32, 16, 16>();
  
  for (var si = sg2.x; si < sg2.y; si++) {
    if (lid == 0u) {
      if (P.dense == 1u) { tiles = vec2<u32>(0u, t + 1u); }
      else { let J = cols[si]; tiles = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
    }
    let kr = workgroupUniformLoad(&tiles);
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      let kBase = (k0 * P.Hkv + g) * D;
      
      for (var x = lid; x < 4096u; x += 128u) {
        let kp = k0 + x / 64u;
        var w = 0u;
        if (kp < P.n) { w = K[((kp * P.Hkv + g) * D) / 2u + x % 64u]; }
        let hv = bitcast<vec2<f16>>(w);
        KVs[2u * x] = hv.x;
        KVs[2u * x + 1u] = hv.y;
      }
      workgroupBarrier();
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 0u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 16u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 32u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 48u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 64u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 80u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 96u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 112u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 0u, acc, false, 64u);
      }
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2048u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2064u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2080u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2096u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2112u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2128u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2144u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 2160u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 16u, acc, false, 64u);
      }
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4096u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4112u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4128u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4144u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4160u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4176u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4192u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 4208u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 32u, acc, false, 64u);
      }
      {
        var acc = subgroup_matrix_result<f32, 16, 16>();
        acc = subgroupMatrixMultiplyAccumulate(qf0, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6144u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf1, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6160u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf2, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6176u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf3, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6192u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf4, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6208u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf5, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6224u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf6, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6240u, true, D), acc);
        acc = subgroupMatrixMultiplyAccumulate(qf7, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, 6256u, true, D), acc);
        subgroupMatrixStore(&Ssh, sg * 1024u + 48u, acc, false, 64u);
      }
      workgroupBarrier();
      for (var c = 0u; c < 32u; c++) {
        let kp = k0 + hc * 32u + c;
        let at = sg * 1024u + r * 64u + hc * 32u + c;
        var p = 0.0;
        if (kp <= pos && kp < P.n) { p = exp2(Ssh[at] * P.scaleLog2 - M) * invL; }
        Psh[at] = f16(p);
      }
      // every subgroup is past its K fragment loads (barrier above): V may replace K
      
      for (var x = lid; x < 4096u; x += 128u) {
        let kp = k0 + x / 64u;
        var w = 0u;
        if (kp < P.n) { w = V[((kp * P.Hkv + g) * D) / 2u + x % 64u]; }
        let hv = bitcast<vec2<f16>>(w);
        KVs[2u * x] = hv.x;
        KVs[2u * x + 1u] = hv.y;
      }
      workgroupBarrier();
      for (var kc = 0u; kc < 4u; kc++) {
        let pf = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Psh, sg * 1024u + kc * 16u, false, 64u);
        let vBase = ((k0 + kc * 16u) * P.Hkv + g) * D;
        o0 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 0u, false, D), o0);
        o1 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 16u, false, D), o1);
        o2 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 32u, false, D), o2);
        o3 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 48u, false, D), o3);
        o4 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 64u, false, D), o4);
        o5 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 80u, false, D), o5);
        o6 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 96u, false, D), o6);
        o7 = subgroupMatrixMultiplyAccumulate(pf, subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&KVs, kc * 16u * D + 112u, false, D), o7);
      }
      // K of the next tile replaces V only after every subgroup has read it
      workgroupBarrier();
    }
    workgroupBarrier();
  }
  let poisonScale = 1.0;
  subgroupMatrixStore(&Ssh, sg * 1024u + 0u, o0, false, 64u);
  subgroupMatrixStore(&Ssh, sg * 1024u + 16u, o1, false, 64u);
  subgroupMatrixStore(&Ssh, sg * 1024u + 32u, o2, false, 64u);
  subgroupMatrixStore(&Ssh, sg * 1024u + 48u, o3, false, 64u);
  workgroupBarrier();
  if (rowOk) {
    let obase = (qRow * P.H + h) * D + 0u;
    for (var c = hc * 32u; c < hc * 32u + 32u; c++) {
      O[obase + c] = f16(Ssh[sg * 1024u + r * 64u + c] * poisonScale);
    }
  }
  workgroupBarrier();
  subgroupMatrixStore(&Ssh, sg * 1024u + 0u, o4, false, 64u);
  subgroupMatrixStore(&Ssh, sg * 1024u + 16u, o5, false, 64u);
  subgroupMatrixStore(&Ssh, sg * 1024u + 32u, o6, false, 64u);
  subgroupMatrixStore(&Ssh, sg * 1024u + 48u, o7, false, 64u);
  workgroupBarrier();
  if (rowOk) {
    let obase = (qRow * P.H + h) * D + 64u;
    for (var c = hc * 32u; c < hc * 32u + 32u; c++) {
      O[obase + c] = f16(Ssh[sg * 1024u + r * 64u + c] * poisonScale);
    }
  }
  workgroupBarrier();
  if (P.returnLse == 1u && rowOk && hc == 0u) {
    LSE[h * P.m + qRow] = select(0xff800000u, bitcast<u32>((M + log2(L)) * LN2), L > 0.0);
  }
}
