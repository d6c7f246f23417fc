// Proxy-statistics pieces shared by the mma.sync passes (proxy.cu) and the warpgroup-MMA
// passes (proxy-wgmma.cu): the part size, pass 1's online update and pass 2b's block-level
// sums. Both files lay a warp's scores out as the m16n8 accumulator fragment s[8][4] of 16
// rows x 64 keys (rows lane / 4 and lane / 4 + 8, columns j·8 + 2·(lane % 4) + {0, 1}), so
// the same code runs on either. Included after crisp-common.cuh (the host splices one level
// of includes: this header includes nothing).
#pragma once

#define PART_TILES 16

// a compile-time bool as a value (generic lambdas take it as `auto` and read ::value)
template <bool V>
struct CrispBool {
  static constexpr bool value = V;
};
#define PART_KEYS (PART_TILES * 64)

// Pass 1's online update for one tile. EDGE: some score is masked (causal limit, keys past
// n, or rows past b when n < B); only the last tiles of a row are, so the common tiles skip
// the compares. Probabilities are p = 2^(s·c − u) in one FFMA, u the row's reference; l and
// the tile's sums are relative to it, t accumulates p·s raw and is scaled once at the end.
//
// The reference is lazy (PROXY_LAZY_LOG2): a common tile first tries the row's current m as
// u, without the tile's max; if every thread's sum of each of its rows stays <= 2^20 (so every
// probability does, and a NaN or an infinity fails), the tile is done and m stays. Otherwise,
// and on EDGE tiles and rows with no m yet, the exact update: m = max(m, tile max), l and t
// rescaled by 2^(m_old − m), the tile's exponentials again. m is then a reference at or
// below the row's running max (any reference gives the same sums up to rounding: combine,
// sweep and fused sums rescale by 2^(m − M) <= 1), and the sums stay below 2^20 a key: no
// overflow in f32. On the common tiles this drops the 32 max compares, the quad's max
// shuffles and the rescale a thread did every tile (Nsight Compute: issue-bound, and the
// exponentials waited on the max's shuffles).
//
// The fused pass (LGB > 0: log2 B) also splits each row's probabilities of the tile
// (relative to the reference) between the two offset blocks they reach, as pass 2b does
// (fragment column j·8 + e <= cut: the block of the tile's first key, ohi; else ohi − 1),
// and, on tiles that hold keys of C_struct's window (win: keys < s0 or >= l0), sums the
// window's: split += {hiA, loA, hiB, loB, winA, winB}, the thread's share. Window tiles must
// come as EDGE tiles (EDGE's masking is harmless on unmasked scores).
//
// ENT false (the lean fused pass, for callers that do not read the row entropy): no t, one
// FFMA a score fewer; tA and tB stay as they were. Every other sum is the same code, so the
// same bits.
#define PROXY_LAZY_LOG2 20
template <bool EDGE, int LGB = 0, bool ENT = true>
__device__ __forceinline__ void proxy_p1_update(float (&s)[8][4], int ks, int rA, int rB, int posA, int posB, int b,
                                                float scaleLog2, float& mA, float& mB, float& lA, float& lB,
                                                float& tA, float& tB, float (&split)[6], int s0 = 0, int l0 = 0,
                                                bool win = false) {
  const int lane = threadIdx.x & 31;
  if (EDGE) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = ks + j * 8 + (lane & 3) * 2 + e;
        if (col > posA || rA >= b) s[j][e] = CRISP_NEG_INF;
        if (col > posB || rB >= b) s[j][2 + e] = CRISP_NEG_INF;
      }
    }
  }
  // The split folded into the exp loop: the tile's sum of each row (ts) and the part of it
  // at fragment columns j·8 + e <= cut (hi; the rest is block ohi − 1): a compare and a
  // predicated add a score. lo = ts − hi once a tile: the same terms summed in the same
  // order, so ts >= hi and lo is exactly 0 when every term is in hi.
  const int shift = LGB > 0 ? LGB : 0;
  const int cutA = LGB > 0 ? posA - (((posA - ks) >> shift) << shift) - ks - (lane & 3) * 2 : 0;
  const int cutB = LGB > 0 ? posB - (((posB - ks) >> shift) << shift) - ks - (lane & 3) * 2 : 0;
  float tsA, tsB, hA, hB, ttA, ttB;
  // SPLIT false: every score of the warp's rows lies at or before its row's cut (the whole
  // tile is in each row's upper offset block: ~39% of the common tiles at B = 128), so hi is
  // the tile sum itself, the same terms in the same order: hi = ts bit for bit, lo = 0.
  auto expTile = [&](auto splitTag, float uA, float uB) {
    constexpr bool SPLIT = decltype(splitTag)::value;
    tsA = 0.f;
    tsB = 0.f;
    hA = 0.f;
    hB = 0.f;
    ttA = 0.f;
    ttB = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float x = s[j][e], y = s[j][2 + e];
        const float pa = exp2f(fmaf(x, scaleLog2, -uA)), pb = exp2f(fmaf(y, scaleLog2, -uB));
        tsA += pa;
        tsB += pb;
        if (SPLIT) {
          if (j * 8 + e <= cutA) hA += pa;
          if (j * 8 + e <= cutB) hB += pb;
        }
        // a masked score is -inf with p = 0: count 0, not 0 · -inf
        if (ENT) {
          ttA = fmaf(pa, EDGE && x == CRISP_NEG_INF ? 0.f : x, ttA);
          ttB = fmaf(pb, EDGE && y == CRISP_NEG_INF ? 0.f : y, ttB);
        }
      }
    }
    if (!SPLIT) {
      hA = tsA;
      hB = tsB;
    }
  };
  // fragment columns run to 7·8 + 1 = 57
  const bool noSplit = LGB > 0 && !EDGE && __all_sync(0xffffffffu, cutA >= 57 && cutB >= 57);
  auto expAny = [&](float uA, float uB) {
    if (noSplit) {
      expTile(CrispBool<false>{}, uA, uB);
    } else {
      expTile(CrispBool<LGB != 0>{}, uA, uB);
    }
  };
  // one copy of the exp loop for both tries (a loop, not two inlined calls: the pass's code
  // stays in the instruction cache)
  float cA = 1.f, cB = 1.f, uA = mA, uB = mB;
  bool exact = EDGE || !__all_sync(0xffffffffu, mA != CRISP_NEG_INF && mB != CRISP_NEG_INF);
#pragma unroll 1
  for (;;) {
    if (exact) {
      float mxA = CRISP_NEG_INF, mxB = CRISP_NEG_INF;
#pragma unroll
      for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          mxA = fmaxf(mxA, s[j][e]);
          mxB = fmaxf(mxB, s[j][2 + e]);
        }
      }
      mxA = quad_max(mxA) * scaleLog2;
      mxB = quad_max(mxB) * scaleLog2;
      const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
      // A row with nothing visible yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
      uA = nA == CRISP_NEG_INF ? 0.f : nA;
      uB = nB == CRISP_NEG_INF ? 0.f : nB;
      cA = exp2f(mA - uA);
      cB = exp2f(mB - uB);
      mA = nA;
      mB = nB;
    }
    expAny(uA, uB);
    if (exact) break;
    constexpr float LIM = (float)(1 << PROXY_LAZY_LOG2);
    if (__all_sync(0xffffffffu, tsA <= LIM && tsB <= LIM)) break;
    exact = true;
  }
  lA = fmaf(lA, cA, tsA);
  lB = fmaf(lB, cB, tsB);
  if (ENT) {
    tA = fmaf(tA, cA, ttA);
    tB = fmaf(tB, cB, ttB);
  }
  if (LGB > 0) {
    split[0] += hA;
    split[1] += tsA - hA;
    split[2] += hB;
    split[3] += tsB - hB;
    // window tiles are few (keys < s0 or >= l0): callers run them as EDGE tiles, so the
    // common tiles carry no window code; the probabilities again (the exp loop keeps none)
    if (EDGE && win) {
      const float uA = mA == CRISP_NEG_INF ? 0.f : mA, uB = mB == CRISP_NEG_INF ? 0.f : mB;
#pragma unroll
      for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int col = ks + j * 8 + (lane & 3) * 2 + e;
          const bool inw = col < s0 || col >= l0;
          split[4] += inw ? exp2f(fmaf(s[j][e], scaleLog2, -uA)) : 0.f;
          split[5] += inw ? exp2f(fmaf(s[j][2 + e], scaleLog2, -uB)) : 0.f;
        }
      }
    }
  }
}

// Pass 1 alone (no split).
template <bool EDGE>
__device__ __forceinline__ void proxy_p1_update(float (&s)[8][4], int ks, int rA, int rB, int posA, int posB, int b,
                                                float scaleLog2, float& mA, float& mB, float& lA, float& lB,
                                                float& tA, float& tB) {
  float none[6];
  proxy_p1_update<EDGE, 0>(s, ks, rA, rB, posA, posB, b, scaleLog2, mA, mB, lA, lB, tA, tB, none);
}

// Pass 1's key block-mean partials from a 64-key tile in shared memory: thread (kd, khalf)
// adds column kd of its CPT chunks of 32 rows to ksum (one accumulator a chunk, summed over
// the block's tiles); at the block's last tile the chunk sums go to kr[chunk][D] and restart.
// at(r) is the byte address of the 16-byte chunk of row r that holds column kd (each layout's
// own swizzle).
template <bool BF16, int CPT, class At>
__device__ __forceinline__ void p1_kmean_tile(float (&ksum)[CPT], float* kr, int khalf, int kd, int D, bool blockEnd,
                                              At at) {
#pragma unroll
  for (int c = 0; c < CPT; c++) {
    const int chunk = khalf * CPT + c;
#pragma unroll 8
    for (int i = 0; i < 32; i++) {
      const int r = chunk * 32 + i;
      ksum[c] += to_f32<BF16>(*reinterpret_cast<const u16*>(at(r) + (kd & 7) * 2));
    }
    if (blockEnd) {
      kr[chunk * D + kd] = ksum[c];
      ksum[c] = 0.f;
    }
  }
}

// Pass 1's key block mean of column kd for block J, from its KCH chunk partials kr[KCH][D]
// (summed in chunk order), over the block's real rows.
template <int KCH, int BM>
__device__ __forceinline__ void p1_write_kmean(const float* kr, float* kMean, int kvh, int Nb, int J, int kd, int D,
                                               int n) {
  float tot = 0.f;
#pragma unroll
  for (int c = 0; c < KCH; c++) tot += kr[c * D + kd];
  const int r0 = J * BM;
  kMean[((size_t)kvh * Nb + J) * D + kd] = tot / (float)(r0 + BM < n ? BM : n - r0);
}

// Pass 1's results for the part of rows rA and rB (a quad of lanes holds a row): m, the
// quad's Σ l and Σ t (t scaled once here), part-major [H][b][nParts].
__device__ __forceinline__ void p1_store_rows(float* pm, float* pl, float* pt, int h, int b, int nParts, int part,
                                              int rA, int rB, float mA, float mB, float lA, float lB, float tA,
                                              float tB, float scaleLog2) {
  const int lane = threadIdx.x & 31;
  const float la = quad_sum(lA), lb = quad_sum(lB);
  const float ta = quad_sum(tA) * scaleLog2, tb = quad_sum(tB) * scaleLog2;
  if ((lane & 3) == 0) {
    if (rA < b) {
      const size_t i = ((size_t)h * b + rA) * nParts + part;
      pm[i] = mA;
      pl[i] = la;
      pt[i] = ta;
    }
    if (rB < b) {
      const size_t i = ((size_t)h * b + rB) * nParts + part;
      pm[i] = mB;
      pl[i] = lb;
      pt[i] = tb;
    }
  }
}

// Pass 2 at block level, for plans that read only block scores (no token scores asked
// for): the normalised probabilities are reduced in registers straight to what the policies
// read, so there are no probability tiles in shared memory and no a_v in global memory. A
// 64-key tile lies in one key block J (B is 64 or 128). A row's 64 keys reach at most two
// offset blocks, split at one column (o = pos − col >= Ohi·B <=> col <= cut): each thread
// sums its probabilities of a row into two bins, `hx = c <= cut ? x : 0; hi += hx;
// lo += x − hx` (x − hx is x or 0, exactly), then places the row's two bins among the
// tile's three offset blocks Obase .. Obase + 2 (its offsets span b + 62 < 2B values); the
// tile's vertical mass is the sum of the three. Window tiles (keys < wSink or >= n − wLocal,
// each key once) also sum C_struct's mass. Five values a tile (P2B_VALS): butterfly in the
// warp, then the warps in order into the part's accumulators, one tile behind. Outputs,
// already divided by b: pv [H][Nb] (a key block lies in one part), slashPart
// [H][nParts][SB] (offset blocks Opart0 .. Opart0 + SB − 1 of the part), winPart
// [H][nParts]. Fixed order everywhere: reproducible bits.
#define P2B_VALS 5

// One warp's 16 rows of a tile: probabilities written over the scores (masked: 0), and the
// thread's share of the tile's three offset-block bins.
template <int LGB>
__device__ __forceinline__ void p2b_rows(float (&s)[8][4], int ks, int b, int posA, int posB, bool liveA, bool liveB,
                                         float lseA, float lseB, bool edge, int obase, float scaleLog2,
                                         float (&bins)[3]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const int pos = half ? posB : posA;
    const float lse = half ? lseB : lseA;
    const bool live = half ? liveB : liveA;
    const int ohi = (pos - ks) >> LGB;                       // offset block of the tile's first key
    const int cut = pos - (ohi << LGB) - ks - (lane & 3) * 2;  // fragment column j·8 + e <= cut: block ohi
    const int last = pos - ks - (lane & 3) * 2;                // j·8 + e > last: a future key (masked)
    float hi = 0.f, lo = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float x = exp2f(fmaf(s[j][half * 2 + e], scaleLog2, -lse));
        if (edge && (j * 8 + e > last || !live)) x = 0.f;
        s[j][half * 2 + e] = x;
        const float hx = j * 8 + e <= cut ? x : 0.f;
        hi += hx;
        lo += x - hx;
      }
    }
    const int bh = ohi - obase;  // 0 .. 2; lo is one block lower (empty when bh = 0)
    bins[0] += bh == 0 ? hi : (bh == 1 ? lo : 0.f);
    bins[1] += bh == 1 ? hi : (bh == 2 ? lo : 0.f);
    bins[2] += bh == 2 ? hi : 0.f;
  }
}

// C_struct's window mass of the thread's probabilities in a tile (keys < s0 or >= l0).
__device__ __forceinline__ float p2b_window(const float (&s)[8][4], int ks, int s0, int l0) {
  const int lane = threadIdx.x & 31;
  float w = 0.f;
#pragma unroll
  for (int j = 0; j < 8; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int col = ks + j * 8 + (lane & 3) * 2 + (e & 1);
      if (col < s0 || col >= l0) w += s[j][e];
    }
  }
  return w;
}

// The tile's five sums of one warp (vertical, three offset blocks, window), butterflied and
// stashed at red[(buf · NW + warp) · P2B_VALS ..].
template <int NW>
__device__ __forceinline__ void p2b_stash(float* red, int buf, const float (&bins)[3], float w) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float vals[P2B_VALS] = {bins[0] + bins[1] + bins[2], bins[0], bins[1], bins[2], w};
#pragma unroll
  for (int i = 0; i < P2B_VALS; i++) vals[i] = warp_sum(vals[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < P2B_VALS; i++) red[(buf * NW + warp) * P2B_VALS + i] = vals[i];
  }
}

// Threads 0 .. 4: the stashed sums of the tile at key kp (parity pb), warps in order, into
// the part's accumulators: vacc [key blocks of the part], sacc [SB offset blocks from
// opart0], wacc [1].
template <int NW, int LGB>
__device__ __forceinline__ void p2b_combine(const float* red, int pb, int kp, int ps, int n, int b, int opart0,
                                            float* vacc, float* sacc, float* wacc) {
  const int tid = threadIdx.x;
  if (tid >= P2B_VALS) return;
  float sum = 0.f;
  for (int w = 0; w < NW; w++) sum += red[(pb * NW + w) * P2B_VALS + tid];
  if (tid == 0) vacc[(kp - ps) >> LGB] += sum;
  else if (tid < 4) sacc[((n - b - kp - 63) >> LGB) + (tid - 1) - opart0] += sum;
  else *wacc += sum;
}

// The part's accumulators (acc = [vacc NV | sacc SB | wacc 1]) to global memory, times 1 / b.
template <int LGB, int NV, int SB, int NT>
__device__ __forceinline__ void p2b_write(const float* acc, float* pv, float* slashPart, float* winPart, int h,
                                          int part, int nParts, int ps, int n, int b) {
  const float invB = 1.f / (float)b;
  const int Nb = (n + (1 << LGB) - 1) >> LGB;
  for (int i = threadIdx.x; i < NV + SB + 1; i += NT) {
    if (i < NV) {
      const int J = (ps >> LGB) + i;
      if (J < Nb) pv[(size_t)h * Nb + J] = acc[i] * invB;
    } else if (i < NV + SB) {
      slashPart[((size_t)h * nParts + part) * SB + (i - NV)] = acc[i] * invB;
    } else {
      winPart[(size_t)h * nParts + part] = acc[i] * invB;
    }
  }
}

// The fused pass (pass 1 and the block-level sums in one sweep over the keys, for plans
// that read no token scores): the block scores need each row's probabilities normalised by
// the row's final log-sum-exp, which only exists once every part is done, so a part keeps
// them per row, relative to the row's max over the part, and proxy_fused_sums weights the
// rows once proxy_combine has the log-sum-exps. Per tile each quad stashes its row's
// running max (after the tile), the two offset-block bins and C_struct's window mass in a
// table tup [PART_TILES][4][BM] (row-contiguous: the quads' stores hit distinct banks); at
// the part's end one thread a row rescales its tiles to the part's max, in tile order, into
// the part's bins [NV key blocks | SB offset blocks | window] and writes them row-contiguous:
// bins [H][nParts][NV + SB + 1][b]. Fixed order everywhere: reproducible bits.
#define P1F_SLOTS 4

// The quad's sums of rows rA and rB for tile tt into tup. The four sums (hi and lo of each
// row) reduce-scatter over the quad: lane q ends with sum q of (hA, hB, oA, oB) in three
// shuffles (eight as four quad_sums, whose latency the pass stalled on: Nsight Compute). Each is ((l0 + l1) + (l2 + l3)) as quad_sum's lane 0 has it, up to the order
// of the two terms of an addition, which IEEE addition ignores: the same bits.
template <int BM>
__device__ __forceinline__ void p1f_stash(float* tup, int tt, int rA, int rB, float mA, float mB,
                                          const float (&split)[6], bool win = true) {
  const int q = threadIdx.x & 3;
  const bool odd = (q & 1) != 0, upper = (q & 2) != 0;
  // xor 1: even lanes keep row A's pair (hi, lo), odd lanes row B's
  const float k0 = odd ? split[2] : split[0], k1 = odd ? split[3] : split[1];
  const float x0 = odd ? split[0] : split[2], x1 = odd ? split[1] : split[3];
  const float p0 = k0 + __shfl_xor_sync(0xffffffffu, x0, 1);
  const float p1 = k1 + __shfl_xor_sync(0xffffffffu, x1, 1);
  // xor 2: lanes 0 and 1 keep hi, lanes 2 and 3 lo
  const float v = (upper ? p1 : p0) + __shfl_xor_sync(0xffffffffu, upper ? p0 : p1, 2);
  // the window's sums are zero off window tiles (win: CTA-uniform, so the shuffles may skip)
  const float wA = win ? quad_sum(split[4]) : 0.f, wB = win ? quad_sum(split[5]) : 0.f;
  float* t = tup + tt * P1F_SLOTS * BM;
  const int r = odd ? rB : rA;
  t[(upper ? 2 : 1) * BM + r] = v;
  if (!upper) {
    t[r] = odd ? mB : mA;
    t[3 * BM + r] = odd ? wB : wA;
  }
}

// After the part's last tile (and a barrier): each row's tiles rescaled to the part's max
// (the running max after the last tile, which pass 1 stores as the part's m) and summed in
// tile order into acc [NS][BM] (shared, row r's column owned by one thread), then written to
// bins. A tile lies in one key block; its two bins go to the row's offset blocks ohi and
// ohi − 1 (blocks outside the part's SB hold only masked keys, with p = 0).
template <int LGB, int BM, int NT>
__device__ __forceinline__ void p1f_sweep(const float* tup, float* acc, float* bins, int h, int part, int nParts,
                                          int ps, int nT, int n, int b) {
  constexpr int NV = PART_KEYS >> LGB, SB = NV + 3, NS = NV + SB + 1;
  const int opart0 = (n - b - ps - (PART_KEYS - 1)) >> LGB;
  for (int r = threadIdx.x; r < BM; r += NT) {
    if (r >= b) continue;
#pragma unroll
    for (int i = 0; i < NS; i++) acc[i * BM + r] = 0.f;
    const int pos = n - b + r;
    const float mf = tup[(nT - 1) * P1F_SLOTS * BM + r];
    if (mf != CRISP_NEG_INF) {
      for (int t = 0; t < nT; t++) {
        const float* u = tup + t * P1F_SLOTS * BM + r;
        const float f = exp2f(u[0] - mf);
        const float hi = u[BM] * f, lo = u[2 * BM] * f;
        const int ks = ps + t * 64;
        acc[((t * 64) >> LGB) * BM + r] += hi + lo;
        const int oh = ((pos - ks) >> LGB) - opart0;
        if (oh >= 0 && oh < SB) acc[(NV + oh) * BM + r] += hi;
        if (oh >= 1 && oh <= SB) acc[(NV + oh - 1) * BM + r] += lo;
        acc[(NS - 1) * BM + r] += u[3 * BM] * f;
      }
    }
    float* out = bins + ((size_t)h * nParts + part) * NS * b + r;
#pragma unroll
    for (int i = 0; i < NS; i++) out[(size_t)i * b] = acc[i * BM + r];
  }
}
