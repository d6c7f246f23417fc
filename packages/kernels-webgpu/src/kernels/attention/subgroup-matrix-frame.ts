/**
 * The WGSL every form of the tensor-core attention shares (subgroup-matrix.ts and
 * subgroup-matrix-two-pass.ts): the workgroup's head, query tile and rows, and the walk over
 * its key tiles (dense causal, or the mask row's blocks). Workgroup: 4 subgroups of 32, each
 * owning 16 of the tile's 64 query rows; two lanes per row.
 */

/** The frame's workgroup variables: the mask row's segment range and a segment's key tiles. */
export const SGM_FRAME_VARS = `var<workgroup> seg: vec2<u32>;
var<workgroup> tiles: vec2<u32>;`;

/**
 * The entry point's head up to its rows: sg, r (this lane's row of the subgroup's 16), hc
 * (which half of the tile's keys it handles), h, g, t, q0, rowOff, qb, qBase, pos, qRow, rowOk.
 */
export const SGM_FRAME_ENTRY = `@compute @workgroup_size(128)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
  @builtin(subgroup_id) sgid: u32,
  @builtin(subgroup_invocation_id) lane: u32,
) {
  // Fragment offsets must be subgroup-uniform for the matrix builtins: subgroup_id is
  // (lid / 32 is not, and Tint rejects a kernel built on it).
  let sg = sgid;
  let r = lane / 2u;          // this thread's row within the subgroup's 16
  let hc = lane % 2u;         // which 32 of the tile's 64 keys it handles
  let h = HT[P.headBase + wid.x];
  let g = h / (P.H / P.Hkv);
  let t = P.firstTile + P.numTiles - 1u - wid.y;
  let q0 = t * 64u;
  let rowOff = P.n - P.m;
  // Fragment rows: 16 consecutive q rows, clamped into the tensor (chunked prefill and
  // short m); only rows inside this subgroup's slice of the tile are written.
  let qb = u32(clamp(i32(q0 + sg * 16u) - i32(rowOff), 0, max(i32(P.m) - 16, 0)));
  let qBase = (qb * P.H + h) * D;
  let pos = rowOff + qb + r;
  let qRow = qb + r;
  let rowOk = pos >= q0 + sg * 16u && pos < q0 + sg * 16u + 16u && pos < P.n;`;

/** The mask row's segment range into `sg2` (lid 0 reads it, and runs `lid0` too). */
export function sgmFrameSegments(lid0 = ''): string {
  return `let I = q0 / P.B;
  let tpb = P.B / 64u;
  if (lid == 0u) {
    if (P.dense == 1u) { seg = vec2<u32>(0u, 1u); }
    else { seg = vec2<u32>(rowPtr[h * P.Nb + I], rowPtr[h * P.Nb + I + 1u]); }${lid0 ? `\n    ${lid0}` : ''}
  }
  let sg2 = workgroupUniformLoad(&seg);`;
}

/** `body` once per key tile (its first key k0) of the segments in `sg2`, up to the diagonal tile. */
export function sgmFrameTiles(body: string): string {
  return `
  for (var si = sg2.x; si < sg2.y; si++) {
    if (lid == 0u) {
      if (P.dense == 1u) { tiles = vec2<u32>(0u, t + 1u); }
      else { let J = cols[si]; tiles = vec2<u32>(J * tpb, min(J * tpb + tpb, t + 1u)); }
    }
    let kr = workgroupUniformLoad(&tiles);
    for (var kt = kr.x; kt < kr.y; kt++) {
      let k0 = kt * 64u;
      ${body}
    }
    workgroupBarrier();
  }`;
}
