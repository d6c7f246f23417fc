// Fused proxy statistics. The proxy map Â[h] = softmax_j(Q̂ K_hᵀ · scale) (Q̂ = the last
// b = min(B, n) queries, causal) is never stored: pass 1 reduces each proxy row to its
// max, normaliser and Σ p·s (for the entropy), pass 2 recomputes the scores, normalises
// them and reduces them to the vertical token scores a_v[j] (column means) and slash
// token scores a_s[o] (means along diagonals, o = query position − key position).
// proxy-reduce.cu's kernels then merge the rows and reduce the scores to the per-block and
// per-head statistics in f64. When no token scores are asked for (the CRISP preset), pass 2b
// replaces pass 2: it reduces the probabilities in registers to block scores and C_struct's
// window mass, and proxy_blocks_b gathers them.
//
// Shape legend: q [n, H, D], k [n, Hkv, D]; b <= B = BM proxy rows; one CTA per
// (head, part of PART_KEYS = 1024 keys), heads fastest (the H / Hkv heads reading one kv head
// run side by side, so their K tiles come from L2); keys stream in 64-key tiles, double
// buffered with cp.async, one barrier a tile. Scores come from the tensor cores (mma.sync), everything after
// them is fp32 (f64 in the last two kernels). All reductions run in a fixed order (no
// float atomics), so the statistics are bit-for-bit reproducible.
#include "../common/crisp-common.cuh"
#include "proxy-common.cuh"

// Diagonal partial slots per 32-row group: d = c − r spans 95 values over 32 rows x 64 cols.
#define DIAG_SLOTS 96
// CTAs per SM pass 1 is built for: its Q fragments come from shared memory, which leaves the
// 32-row layout at ~167 registers (3 CTAs of 4 warps: 2.35 -> 2.11 ms at 512k on the H200);
// the 16-row layout stays at 2 CTAs of 8 warps (3 would cap it at 80 registers and spill,
// for no gain measured).
#define P1_CTAS(MT) ((MT) == 2 ? 3 : 2)

template <int D, int BM, int NT>
__device__ __forceinline__ void proxy_load_q(const u16* __restrict__ q, int n, int qOff, int H, int b, int h, u32 sQ) {
  constexpr int ROWB = D * 2, CH = D / 8;
  for (int c = threadIdx.x; c < BM * CH; c += NT) {
    // proxy row r sits at position n - b + r, q's row n - b + r - qOff (q holds positions
    // qOff .. n - 1: chunked prefill over a cached prefix when qOff > 0)
    const int r = c / CH, ch = c % CH, row = n - b + r - qOff;
    const bool ok = r < b;
    cp_async16(sQ + swz(r, ch, ROWB), q + (size_t)(ok ? row : n - 1 - qOff) * H * D + (size_t)h * D + ch * 8, ok ? 16 : 0);
  }
}

// One 64-key tile of kv head kvh from key ks; keys past n are zero-filled.
template <int D, int NT>
__device__ __forceinline__ void proxy_load_k(const u16* __restrict__ k, int n, int Hkv, int kvh, int ks, u32 sK) {
  constexpr int ROWB = D * 2, CH = D / 8;
  for (int c = threadIdx.x; c < 64 * CH; c += NT) {
    const int r = c / CH, ch = c % CH, key = ks + r;
    cp_async16(sK + swz(r, ch, ROWB), k + (size_t)(key < n ? key : n - 1) * Hkv * D + (size_t)kvh * D + ch * 8,
               key < n ? 16 : 0);
  }
}

// The warp's MT x 16 proxy rows against the 64-key tile in sK: s[mt][j] holds columns
// j*8 .. j*8+7 of m-tile mt (mma accumulator layout: rows lane/4 and lane/4 + 8, columns
// 2*(lane%4) + {0, 1}). Each K fragment feeds MT MMAs: with MT = 2 a warp reads half the
// shared memory per FLOP.
template <int D, int MT, bool BF16>
__device__ __forceinline__ void proxy_tile_scores(u32 sK, const u32 (&qf)[MT][D / 16][4], float (&s)[MT][8][4]) {
  constexpr int ROWB = D * 2;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int j = 0; j < 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
    for (int np = 0; np < 4; np++) {
      u32 bb[4];
      ldsm_x4(bb, sK + swz(np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma16816<BF16>(s[mt][2 * np], qf[mt][kk], bb[0], bb[1]);
        mma16816<BF16>(s[mt][2 * np + 1], qf[mt][kk], bb[2], bb[3]);
      }
    }
  }
}

template <int D, int MT>
__device__ __forceinline__ void proxy_q_frags(u32 sQ, u32 (&qf)[MT][D / 16][4]) {
  constexpr int ROWB = D * 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      ldsm_x4(qf[mt][kk], sQ + swz(warp * 16 * MT + mt * 16 + (lane & 15), kk * 2 + (lane >> 4), ROWB));
    }
  }
}

// As proxy_tile_scores, with the Q fragments read from shared memory at each k-step (pass 1
// keeps two tiles' scores live instead of Q: the same products in the same order, so the
// same bits).
template <int D, int MT, bool BF16>
__device__ __forceinline__ void proxy_tile_scores_sq(u32 sQ, u32 sK, float (&s)[MT][8][4]) {
  constexpr int ROWB = D * 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int j = 0; j < 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      ldsm_x4(a[mt], sQ + swz(warp * 16 * MT + mt * 16 + (lane & 15), kk * 2 + (lane >> 4), ROWB));
    }
#pragma unroll
    for (int np = 0; np < 4; np++) {
      u32 bb[4];
      ldsm_x4(bb, sK + swz(np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma16816<BF16>(s[mt][2 * np], a[mt], bb[0], bb[1]);
        mma16816<BF16>(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
      }
    }
  }
}

// Pass 1: per (head, proxy row, part): m (a reference at or below the max of the scaled log2
// scores: proxy_p1_update), l = Σ 2^(s−m), t = Σ 2^(s−m)·s. Written to part-major arrays
// [H][b][nParts]. Also, from the tiles already in shared memory, FlexPrefill's pooled-estimate
// inputs: the key block means K̄_J [Hkv][Nb][D] (a part's by query head part % G of its kv
// group) and the proxy-row mean
// mean(Q̂) [H][D] (by part 0). BM = B proxy-row slots, warps of MT x 16 rows. FUSED: the
// fused pass (proxy-common.cuh), which also writes the part's block-level bins (bins,
// wSink, wLocal).
template <int D, int BM, int MT, bool BF16, bool FUSED>
__device__ __forceinline__ void proxy_pass1_body(const u16* __restrict__ q, const u16* __restrict__ k, float* pm,
                                                 float* pl, float* pt, float* qMean, float* kMean, float* bins,
                                                 int n, int H, int Hkv, int b, int qOff, float scaleLog2, int wSink,
                                                 int wLocal) {
  // (the kernel after it, proxy_combine, is launched programmatically: CRISP_PDL_ENTRY)
  pdl_trigger();
  constexpr int ROWB = D * 2, NW = BM / (16 * MT), NT = NW * 32;
  static_assert(NT >= D, "the block means give each thread one column");
  // Block means: each column of a tile in two 32-row chunks, one accumulator per chunk
  // (summed over the block's tiles, then chunk 0 + chunk 1), whatever the thread count, so
  // both layouts give the same bits. TPC threads per column, CPT chunks per thread.
  constexpr int KCH = 2, TPC = NT / D >= KCH ? KCH : NT / D, CPT = KCH / TPC, TPB = BM / 64;
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 sQ = smem_addr(smem), sK = sQ + BM * ROWB;
  float* kred = reinterpret_cast<float*>(smem + BM * ROWB + 2 * 64 * ROWB);  // [2 parities][KCH][D]
  float* tup = kred + 2 * KCH * D;  // FUSED: [PART_TILES][P1F_SLOTS][BM]
  constexpr int LGB = !FUSED ? 0 : BM == 128 ? 7 : 6;
  const int s0 = wSink < n ? wSink : n, l0 = n - wLocal > 0 ? n - wLocal : 0;
  const int h = blockIdx.x, part = blockIdx.y, nParts = gridDim.y;
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int rA[MT], rB[MT], posA[MT], posB[MT];
  float mA[MT], mB[MT], lA[MT], lB[MT], tA[MT], tB[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    rA[mt] = warp * 16 * MT + mt * 16 + (lane >> 2);
    rB[mt] = rA[mt] + 8;
    posA[mt] = n - b + rA[mt];
    posB[mt] = n - b + rB[mt];
    mA[mt] = mB[mt] = CRISP_NEG_INF;
    lA[mt] = lB[mt] = tA[mt] = tB[mt] = 0.f;
  }
  const int ps = part * PART_KEYS;
  int nT = (n - ps + 63) / 64;
  if (nT > PART_TILES) nT = PART_TILES;
  // each part's key block means by one head of the kv group, in turn (as proxy-wgmma.cu)
  const bool doMeans = h % (H / Hkv) == part % (H / Hkv);
  const int kd = tid % D, khalf = tid / D;
  const int Nb = (n + BM - 1) / BM;
  float ksum[CPT];
#pragma unroll
  for (int c = 0; c < CPT; c++) ksum[c] = 0.f;
  proxy_load_q<D, BM, NT>(q, n, qOff, H, b, h, sQ);
  proxy_load_k<D, NT>(k, n, Hkv, kvh, ps, sK);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // Q and tile 0 in shared memory
  // One barrier a tile: at the end of tile tt every warp is done with buffer tt & 1's
  // previous tile (so tile tt + 1 may land in the other buffer, issued at the top) and
  // tile tt + 1 has arrived. Between barriers warps drift: one warp's exp/sums overlap
  // another's MMAs.
  for (int tt = 0; tt < nT; tt++) {
    const int ks = ps + tt * 64;
    const int buf = tt & 1;
    if (tt + 1 < nT) proxy_load_k<D, NT>(k, n, Hkv, kvh, ks + 64, sK + (buf ^ 1) * 64 * ROWB);
    cp_async_commit();
    if (tt == 0) {
      if (part == 0 && tid < D) {
        float s = 0.f;
        for (int r = 0; r < b; r++) {
          s += to_f32<BF16>(*reinterpret_cast<const u16*>(smem + swz(r, tid >> 3, ROWB) + (tid & 7) * 2));
        }
        qMean[(size_t)h * D + tid] = s / (float)b;
      }
    } else if (doMeans && khalf == 0 && (tt - 1) % TPB == TPB - 1) {
      // the block that ended at tile tt − 1: its chunk partials were written before the barrier
      p1_write_kmean<KCH, BM>(kred + ((((tt - 1) / TPB) & 1) * KCH) * D, kMean, kvh, Nb, (ks - 64) / BM, kd, D, n);
    }
    float s[MT][8][4];
    proxy_tile_scores_sq<D, MT, BF16>(sQ, sK + buf * 64 * ROWB, s);
    const bool blockEnd = tt % TPB == TPB - 1 || tt == nT - 1;
    if (doMeans && khalf < TPC) {
      const unsigned char* kt = smem + BM * ROWB + buf * 64 * ROWB;
      // two kred slots by block parity: block J's are read after the next barrier, while
      // block J + 1 may already be writing
      p1_kmean_tile<BF16, CPT>(ksum, kred + (((tt / TPB) & 1) * KCH) * D, khalf, kd, D, blockEnd,
                               [&](int r) { return kt + swz(r, kd >> 3, ROWB); });
    }
    const bool edge = ks + 63 > n - b || b < BM;
    const bool win = FUSED && (ks < s0 || ks + 63 >= l0);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      float split[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (edge || win) {
        proxy_p1_update<true, LGB>(s[mt], ks, rA[mt], rB[mt], posA[mt], posB[mt], b, scaleLog2, mA[mt], mB[mt],
                                   lA[mt], lB[mt], tA[mt], tB[mt], split, s0, l0, win);
      } else {
        proxy_p1_update<false, LGB>(s[mt], ks, rA[mt], rB[mt], posA[mt], posB[mt], b, scaleLog2, mA[mt], mB[mt],
                                    lA[mt], lB[mt], tA[mt], tB[mt], split, s0, l0, win);
      }
      if (FUSED) p1f_stash<BM>(tup, tt, rA[mt], rB[mt], mA[mt], mB[mt], split, win);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  if (doMeans && khalf == 0) {
    // the last block (it ends at the last tile, full or not)
    const int tl = nT - 1;
    p1_write_kmean<KCH, BM>(kred + (((tl / TPB) & 1) * KCH) * D, kMean, kvh, Nb, (ps + tl * 64) / BM, kd, D, n);
  }
  // the part's bins, accumulated over the K tiles' shared memory (free after the last barrier)
  if (FUSED) p1f_sweep<LGB, BM, NT>(tup, reinterpret_cast<float*>(smem + BM * ROWB), bins, h, part, nParts, ps, nT, n, b);
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    p1_store_rows(pm, pl, pt, h, b, nParts, part, rA[mt], rB[mt], mA[mt], mB[mt], lA[mt], lB[mt], tA[mt], tB[mt],
                  scaleLog2);
  }
}

// Pass 2: normalised probabilities of each 64-key tile go to shared memory (P, BM x 64);
// then each thread takes one column c' and a group of 32 rows (several groups in turn when
// there are fewer than 2·BM threads): it sums the column (a_v) and the skewed column
// P[r][(c' + r) mod 64], which walks one diagonal d = c − r until the column index wraps
// and the next one (d − 64) after, so the diagonal sums need no serial walk either. Group
// partials are combined in group order: a_v straight to global memory, diagonals into the
// part's slash accumulator (a_s partials, gathered per offset by proxy_blocks).
// Software-pipelined, one barrier a tile: between two barriers a CTA computes tile tt's
// scores and probabilities, reduces tile tt − 1's probabilities and combines tile tt − 2's
// partials (two probability tiles, the first over Q's shared memory, and two partial sets).
// P rows are 64 floats with the column XOR-ed by 8·(r mod 4): the float2 stores from the
// MMA layout (8 rows x 4 column pairs a half-warp) and the column and skewed-diagonal reads
// (32 consecutive columns mod 64) are all bank-conflict free.
__device__ __forceinline__ int p_at(int r, int c) { return r * 64 + (c ^ ((r & 3) << 3)); }

template <int BM, int NT>
__device__ __forceinline__ void proxy_reduce_tile(const float* P, float* colPart, float* diagPart) {
  constexpr int NRG = BM / 32, NTG = NT / 64;
  const int tid = threadIdx.x, cp = tid & 63, g = tid >> 6;
#pragma unroll
  for (int gg = g; gg < NRG; gg += NTG) {
    const int r0 = gg * 32;
    const int c0 = (cp + r0) & 63;  // column of the skewed walk at row r0
    const int n1 = 64 - c0;         // rows of the walk before the wrap (>= 32: none wraps)
    float col = 0.f, d1 = 0.f, d2 = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int r = r0 + i;
      col += P[p_at(r, cp)];
      const float v = P[p_at(r, (cp + r) & 63)];
      if (i < n1) d1 += v;
      else d2 += v;
    }
    colPart[gg * 64 + cp] = col;
    // slot of diagonal d in group gg: d + 32gg + 31 (d spans [-32gg - 31, 63 - 32gg])
    diagPart[gg * DIAG_SLOTS + c0 + 31] = d1;               // d = c0 − r0
    if (c0 >= 33) diagPart[gg * DIAG_SLOTS + c0 - 33] = d2;  // d = c0 − r0 − 64
  }
}

// Tile tt's group partials: a_v of its 64 keys to global memory, its diagonals into acc.
template <int BM, int NT>
__device__ __forceinline__ void proxy_combine_tile(const float* colPart, const float* diagPart, float* acc,
                                                   float* avRow, int ks, int tt, int n, float invB) {
  constexpr int NRG = BM / 32;
  for (int i = threadIdx.x; i < 64 + BM + 63; i += NT) {
    if (i < 64) {
      float sum = 0.f;
#pragma unroll
      for (int gg = 0; gg < NRG; gg++) sum += colPart[gg * 64 + i];
      if (ks + i < n) avRow[ks + i] = sum * invB;
    } else {
      const int d = i - 64 - (BM - 1);  // -(BM − 1) .. 63
      float sum = 0.f;
#pragma unroll
      for (int gg = 0; gg < NRG; gg++) {
        if (d >= -32 * gg - 31 && d <= 63 - 32 * gg) sum += diagPart[gg * DIAG_SLOTS + d + 32 * gg + 31];
      }
      // offset o = n − b − ks − d, stored at o − oMin, oMin = n − b − ps − (PART_KEYS − 1)
      acc[(PART_KEYS - 1) - tt * 64 - d] += sum;
    }
  }
}

template <int D, int BM, int MT, bool BF16>
__device__ __forceinline__ void proxy_pass2_body(const u16* __restrict__ q, const u16* __restrict__ k,
                                                 const float* rowLse2, float* av, float* slashPart, int n, int H,
                                                 int Hkv, int b, int qOff, float scaleLog2) {
  constexpr int ROWB = D * 2, NW = BM / (16 * MT), NT = NW * 32;
  constexpr int NRG = BM / 32;        // 32-row groups
  constexpr int SP = PART_KEYS + BM;  // slash partial length per part
  constexpr int PB = BM * 64 * 4;     // one probability tile, bytes
  constexpr int QB = BM * ROWB > PB ? BM * ROWB : PB;
  constexpr int RED = NRG * (64 + DIAG_SLOTS);  // one set of group partials, floats
  static_assert(NT >= 64, "64 threads at least");
  extern __shared__ __align__(128) unsigned char smem[];
  // [Q | P0][P1][K0][K1][partials x2][acc]
  const u32 sQ = smem_addr(smem), sK = sQ + QB + PB;
  float* P0 = reinterpret_cast<float*>(smem);
  float* P1 = reinterpret_cast<float*>(smem + QB);
  float* red = reinterpret_cast<float*>(smem + QB + PB + 2 * 64 * ROWB);
  float* acc = red + 2 * RED;
  const int h = blockIdx.x, part = blockIdx.y, nParts = gridDim.y;
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int rA[MT], rB[MT], posA[MT], posB[MT];
  float lseA[MT], lseB[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    rA[mt] = warp * 16 * MT + mt * 16 + (lane >> 2);
    rB[mt] = rA[mt] + 8;
    posA[mt] = n - b + rA[mt];
    posB[mt] = n - b + rB[mt];
    lseA[mt] = rA[mt] < b ? rowLse2[h * b + rA[mt]] : 0.f;
    lseB[mt] = rB[mt] < b ? rowLse2[h * b + rB[mt]] : 0.f;
  }
  const float invB = 1.f / (float)b;
  float* avRow = av + (size_t)h * n;
  for (int i = tid; i < SP; i += NT) acc[i] = 0.f;
  const int ps = part * PART_KEYS;
  int nT = (n - ps + 63) / 64;
  if (nT > PART_TILES) nT = PART_TILES;
  u32 qf[MT][D / 16][4];
  proxy_load_q<D, BM, NT>(q, n, qOff, H, b, h, sQ);
  proxy_load_k<D, NT>(k, n, Hkv, kvh, ps, sK);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // Q and tile 0 in shared memory
  proxy_q_frags<D, MT>(sQ, qf);
  // phase tt (tt = 0 .. nT + 1): scores of tile tt into P[(tt + 1) & 1] (tile 0 goes to P1,
  // so P0 = Q's memory is first written after a barrier), reduce tile tt − 1, combine tile
  // tt − 2; one barrier at the end, which also makes tile tt + 1 visible.
  for (int tt = 0; tt < nT + 2; tt++) {
    const int ks = ps + tt * 64;
    const int buf = tt & 1;
    if (tt + 1 < nT) proxy_load_k<D, NT>(k, n, Hkv, kvh, ks + 64, sK + (buf ^ 1) * 64 * ROWB);
    cp_async_commit();
    if (tt < nT) {
      float s[MT][8][4];
      proxy_tile_scores<D, MT, BF16>(sK + buf * 64 * ROWB, qf, s);
      float* P = (tt & 1) ? P0 : P1;
      const bool edge = ks + 63 > n - b || b < BM;
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
          const int c = j * 8 + (lane & 3) * 2;
          float2 x, y;
          x.x = exp2f(fmaf(s[mt][j][0], scaleLog2, -lseA[mt]));
          x.y = exp2f(fmaf(s[mt][j][1], scaleLog2, -lseA[mt]));
          y.x = exp2f(fmaf(s[mt][j][2], scaleLog2, -lseB[mt]));
          y.y = exp2f(fmaf(s[mt][j][3], scaleLog2, -lseB[mt]));
          if (edge) {
            const int col = ks + c;
            if (col > posA[mt] || rA[mt] >= b) x.x = 0.f;
            if (col + 1 > posA[mt] || rA[mt] >= b) x.y = 0.f;
            if (col > posB[mt] || rB[mt] >= b) y.x = 0.f;
            if (col + 1 > posB[mt] || rB[mt] >= b) y.y = 0.f;
          }
          *reinterpret_cast<float2*>(P + p_at(rA[mt], c)) = x;
          *reinterpret_cast<float2*>(P + p_at(rB[mt], c)) = y;
        }
      }
    }
    if (tt >= 1 && tt - 1 < nT) {
      float* R = red + ((tt - 1) & 1) * RED;
      proxy_reduce_tile<BM, NT>((tt - 1) & 1 ? P0 : P1, R, R + NRG * 64);
    }
    if (tt >= 2) {
      const float* R = red + ((tt - 2) & 1) * RED;
      proxy_combine_tile<BM, NT>(R, R + NRG * 64, acc, avRow, ks - 128, tt - 2, n, invB);
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  for (int i = tid; i < SP; i += NT) slashPart[((size_t)h * nParts + part) * SP + i] = acc[i] * invB;
}

// Pass 2b (block level; see proxy-common.cuh), mma.sync layouts: Q fragments from shared
// memory at each k-step as in pass 1, one barrier a tile.
template <int D, int BM, int MT, bool BF16>
__device__ __forceinline__ void proxy_pass2b_body(const u16* __restrict__ q, const u16* __restrict__ k,
                                                  const float* rowLse2, float* pv, float* slashPart, float* winPart,
                                                  int n, int H, int Hkv, int b, int qOff, float scaleLog2, int wSink,
                                                  int wLocal) {
  constexpr int ROWB = D * 2, NW = BM / (16 * MT), NT = NW * 32;
  constexpr int LGB = BM == 128 ? 7 : 6;
  constexpr int NV = PART_KEYS / BM;      // key blocks of a part
  constexpr int SB = PART_KEYS / BM + 3;  // offset blocks a part's tiles reach
  static_assert(BM == 64 || BM == 128, "B is 64 or 128");
  static_assert(NT >= P2B_VALS, "one thread per value in the combine");
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 sQ = smem_addr(smem), sK = sQ + BM * ROWB;
  float* red = reinterpret_cast<float*>(smem + BM * ROWB + 2 * 64 * ROWB);  // [2 parities][NW][P2B_VALS]
  float* acc = red + 2 * NW * P2B_VALS;                                       // [NV | SB | 1]
  const int h = blockIdx.x, part = blockIdx.y, nParts = gridDim.y;
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int rA[MT], rB[MT];
  float lseA[MT], lseB[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    rA[mt] = warp * 16 * MT + mt * 16 + (lane >> 2);
    rB[mt] = rA[mt] + 8;
    lseA[mt] = rA[mt] < b ? rowLse2[h * b + rA[mt]] : 0.f;
    lseB[mt] = rB[mt] < b ? rowLse2[h * b + rB[mt]] : 0.f;
  }
  const int ps = part * PART_KEYS;
  int nT = (n - ps + 63) / 64;
  if (nT > PART_TILES) nT = PART_TILES;
  // lowest offset block of the part (offsets below 0 belong to masked entries: p = 0)
  const int opart0 = (n - b - ps - (PART_KEYS - 1)) >> LGB;
  const int s0 = wSink < n ? wSink : n, l0 = n - wLocal > 0 ? n - wLocal : 0;
  for (int i = tid; i < NV + SB + 1; i += NT) acc[i] = 0.f;
  proxy_load_q<D, BM, NT>(q, n, qOff, H, b, h, sQ);
  proxy_load_k<D, NT>(k, n, Hkv, kvh, ps, sK);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // Q, tile 0 and the zeroed accumulators
  // phase tt: tile tt's sums stashed at parity tt & 1; tile tt − 1's combined.
  for (int tt = 0; tt < nT + 1; tt++) {
    const int ks = ps + tt * 64;
    const int buf = tt & 1;
    if (tt + 1 < nT) proxy_load_k<D, NT>(k, n, Hkv, kvh, ks + 64, sK + (buf ^ 1) * 64 * ROWB);
    cp_async_commit();
    if (tt < nT) {
      float s[MT][8][4];
      proxy_tile_scores_sq<D, MT, BF16>(sQ, sK + buf * 64 * ROWB, s);
      const bool edge = ks + 63 > n - b || b < BM;
      const int obase = (n - b - ks - 63) >> LGB;
      float bins[3] = {0.f, 0.f, 0.f};
      float w = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        p2b_rows<LGB>(s[mt], ks, b, n - b + rA[mt], n - b + rB[mt], rA[mt] < b, rB[mt] < b, lseA[mt], lseB[mt], edge,
                      obase, scaleLog2, bins);
        if (ks < s0 || ks + 63 >= l0) w += p2b_window(s[mt], ks, s0, l0);
      }
      p2b_stash<NW>(red, buf, bins, w);
    }
    if (tt >= 1) p2b_combine<NW, LGB>(red, (tt - 1) & 1, ks - 64, ps, n, b, opart0, acc, acc + NV, acc + NV + SB);
    cp_async_wait<0>();
    __syncthreads();
  }
  p2b_write<LGB, NV, SB, NT>(acc, pv, slashPart, winPart, h, part, nParts, ps, n, b);
}

// Layouts: `proxy_pass*_<dtype>_d<D>_b<B>` warps of 16 rows (B / 16 warps);
// `proxy_pass*_w32_...` warps of 32 rows (B / 32 warps; each K fragment feeds two MMAs),
// built where there are at least D threads (not d128 with B = 64).
#define CRISP_PROXY(SUF, D, BM, MT, BF16)                                                                       \
  extern "C" __global__ void __launch_bounds__(BM * 2 / MT, P1_CTAS(MT))                                          \
      proxy_pass1_##SUF(const u16* q, const u16* k, float* pm, float* pl, float* pt, float* qMean, float* kMean,   \
                        int n, int H, int Hkv, int b, int qOff, float scaleLog2) {                              \
    proxy_pass1_body<D, BM, MT, BF16, false>(q, k, pm, pl, pt, qMean, kMean, nullptr, n, H, Hkv, b, qOff,        \
                                             scaleLog2, 0, 0);                                                  \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(BM * 2 / MT, 2)                                                  \
      proxy_pass1f_##SUF(const u16* q, const u16* k, float* pm, float* pl, float* pt, float* qMean,              \
                         float* kMean, float* bins, int n, int H, int Hkv, int b, int qOff, float scaleLog2,     \
                         int wSink, int wLocal) {                                                               \
    proxy_pass1_body<D, BM, MT, BF16, true>(q, k, pm, pl, pt, qMean, kMean, bins, n, H, Hkv, b, qOff, scaleLog2, \
                                            wSink, wLocal);                                                     \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(BM * 2 / MT, 2)                                                  \
      proxy_pass2_##SUF(const u16* q, const u16* k, const float* rowLse2, float* av, float* slashPart, int n,     \
                        int H, int Hkv, int b, int qOff, float scaleLog2) {                                     \
    proxy_pass2_body<D, BM, MT, BF16>(q, k, rowLse2, av, slashPart, n, H, Hkv, b, qOff, scaleLog2);             \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(BM * 2 / MT, P1_CTAS(MT))                                          \
      proxy_pass2b_##SUF(const u16* q, const u16* k, const float* rowLse2, float* pv, float* slashPart,           \
                         float* winPart, int n, int H, int Hkv, int b, int qOff, float scaleLog2, int wSink,     \
                         int wLocal) {                                                                          \
    proxy_pass2b_body<D, BM, MT, BF16>(q, k, rowLse2, pv, slashPart, winPart, n, H, Hkv, b, qOff, scaleLog2,    \
                                       wSink, wLocal);                                                          \
  }

CRISP_PROXY(bf16_d64_b64, 64, 64, 1, true)
CRISP_PROXY(bf16_d64_b128, 64, 128, 1, true)
CRISP_PROXY(bf16_d128_b64, 128, 64, 1, true)
CRISP_PROXY(bf16_d128_b128, 128, 128, 1, true)
CRISP_PROXY(f16_d64_b64, 64, 64, 1, false)
CRISP_PROXY(f16_d64_b128, 64, 128, 1, false)
CRISP_PROXY(f16_d128_b64, 128, 64, 1, false)
CRISP_PROXY(f16_d128_b128, 128, 128, 1, false)
CRISP_PROXY(w32_bf16_d64_b64, 64, 64, 2, true)
CRISP_PROXY(w32_bf16_d64_b128, 64, 128, 2, true)
CRISP_PROXY(w32_bf16_d128_b128, 128, 128, 2, true)
CRISP_PROXY(w32_f16_d64_b64, 64, 64, 2, false)
CRISP_PROXY(w32_f16_d64_b128, 64, 128, 2, false)
CRISP_PROXY(w32_f16_d128_b128, 128, 128, 2, false)
