// Fused proxy statistics. The proxy map Â[h] = softmax_j(Q̂ K_hᵀ · scale) (Q̂ = the last
// b = min(B, n) queries, causal) is never stored: pass 1 reduces each proxy row to its
// max, normaliser and Σ p·s (for the entropy), pass 2 recomputes the scores, normalises
// them and reduces them to the vertical token scores a_v[j] (column means) and slash
// token scores a_s[o] (means along diagonals, o = query position − key position).
// proxy_blocks and proxy_heads then reduce those to the per-block and per-head statistics
// in f64, straight into the one buffer the host downloads. When no token scores are asked
// for (the CRISP preset), pass 2b replaces pass 2: it reduces the probabilities in
// registers to block scores and C_struct's window mass, and proxy_blocks_b gathers them.
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

// Merge the parts of each proxy row: rowLse2 = m + log2 l (log2 units) and the row's
// Shannon entropy in nats, ln2 · (m + log2 l − t / l). One warp per (head, row): lanes take
// parts lane, lane + 32, ... in order, then a butterfly (every lane ends with the same sum).
// CTA 0 also zeroes `zero[0 .. nZero)` (proxy_cstruct's tickets, so they need no memset).
extern "C" __global__ void proxy_combine(const float* pm, const float* pl, const float* pt, float* rowLse2,
                                        float* rowEntropy, int H, int b, int nParts, unsigned* zero, int nZero) {
  CRISP_PDL_ENTRY();
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < nZero; i += blockDim.x) zero[i] = 0u;
  }
  const int w = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (w >= H * b) return;
  const float* m = pm + (size_t)w * nParts;
  float M = CRISP_NEG_INF;
  for (int p = lane; p < nParts; p += 32) M = fmaxf(M, m[p]);
  M = warp_max(M);
  float L = 0.f, T = 0.f;
  for (int p = lane; p < nParts; p += 32) {
    if (m[p] == CRISP_NEG_INF) continue;
    const float c = exp2f(m[p] - M);
    L += pl[(size_t)w * nParts + p] * c;
    T += pt[(size_t)w * nParts + p] * c;
  }
  L = warp_sum(L);
  T = warp_sum(T);
  if (lane == 0) {
    const float lse2 = M + log2f(L);
    rowLse2[w] = lse2;
    rowEntropy[w] = 0.6931471805599453f * (lse2 - T / L);
  }
}

// Row r's weight in a part (proxy_fused_sums and proxy_cstruct: the same bits).
__device__ __forceinline__ float fused_row_weight(const float* pm, const float* rowLse2, int h, int b, int r,
                                                  int part, int nParts, float invB) {
  const float m = pm[((size_t)h * b + r) * nParts + part];
  return m == CRISP_NEG_INF ? 0.f : exp2f(m - rowLse2[h * b + r]) * invB;
}

// One bin of a part, Σ_r wt(r) · x[r] with lane l taking rows l, l + 32, ... in order, then
// a butterfly: the warp's lanes all hold the sum.
template <class Wt>
__device__ __forceinline__ float fused_bin_sum(Wt wt, const float* x, int b) {
  const int lane = threadIdx.x & 31;
  float sum = 0.f;
  for (int r = lane; r < b; r += 32) sum = fmaf(wt(r), x[r], sum);
  return warp_sum(sum);
}

// The fused pass's bins to block scores, per (part, head), 256 threads: row r's weight
// 2^(m_r − lse_r) / b (its part max against its log-sum-exp; 0 where the part holds no key
// the row sees), then each bin's Σ_r weight · bin, rows in order (lanes take r, r + 32, ...,
// then a butterfly), one warp a bin. Outputs as pass 2b's: pv [H][Nb] (a key block lies in
// one part), slashPart [H][nParts][SB]; the window bin is proxy_cstruct's.
// A warp's bins (warp, warp + 8, ...: at most FS_BINS) are loaded before the weights are
// computed, so its loads are all in flight at once: the kernel was a chain of load latencies
// (weights, then each bin in turn), 0.024 ms at 128k on the H200. The sums are the same
// fmaf's in the same order (fused_bin_sum's), so the same bits. b <= FS_ROWS (B is 64 or 128).
#define FS_BINS 5
#define FS_ROWS 128
extern "C" __global__ void __launch_bounds__(256) proxy_fused_sums(const float* bins, const float* pm, const float* rowLse2,
                                                                    float* pv, float* slashPart, int n, int H, int b,
                                                                    int B, int nParts) {
  CRISP_PDL_ENTRY();
  __shared__ float wt[FS_ROWS];
  const int part = blockIdx.x, h = blockIdx.y;
  const int lgB = B == 128 ? 7 : 6;
  const int NV = PART_KEYS >> lgB, SB = NV + 3, NS = NV + SB + 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, NW = blockDim.x >> 5;
  // this warp's bins' values, rows lane, lane + 32, ... (0 past b or past the last bin)
  const float* base = bins + ((size_t)h * nParts + part) * NS * b;
  float x[FS_BINS][FS_ROWS / 32];
#pragma unroll
  for (int k = 0; k < FS_BINS; k++) {
    const int i = warp + k * NW;
#pragma unroll
    for (int j = 0; j < FS_ROWS / 32; j++) {
      const int r = lane + 32 * j;
      x[k][j] = i < NV + SB && r < b ? base[(size_t)i * b + r] : 0.f;
    }
  }
  const float invB = 1.f / (float)b;
  for (int r = threadIdx.x; r < b; r += blockDim.x) wt[r] = fused_row_weight(pm, rowLse2, h, b, r, part, nParts, invB);
  __syncthreads();
  const int Nb = (n + B - 1) >> lgB;
#pragma unroll
  for (int k = 0; k < FS_BINS; k++) {
    const int i = warp + k * NW;
    if (i >= NV + SB) break;  // uniform in the warp
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < FS_ROWS / 32; j++) {
      const int r = lane + 32 * j;
      if (r < b) sum = fmaf(wt[r], x[k][j], sum);
    }
    sum = warp_sum(sum);
    if (lane != 0) continue;
    if (i < NV) {
      const int J = ((part * PART_KEYS) >> lgB) + i;
      if (J < Nb) pv[(size_t)h * Nb + J] = sum;
    } else {
      slashPart[((size_t)h * nParts + part) * SB + (i - NV)] = sum;
    }
  }
}

// C_struct from the fused pass alone, so that routing can start before the rest of the
// statistics (planOnDevice runs the router and the PE kernels on a second stream beside
// them). Grid [nParts, H], one warp a CTA: the part's window mass exactly as
// proxy_fused_sums computes a bin (lane l weights and adds rows l, l + 32, ... in order, then
// a butterfly: the same bits) into winPart; then a ticket (tickets[h], zeroed by
// proxy_combine), and the head's last CTA sums the parts in f64 in proxy_heads' order: 256
// sums, sum v taking parts v, v + 256, ... (its lanes take v = lane, lane + 32, ...), then
// the same tree, into out[h]; proxy_heads then leaves C_struct alone (given neither av nor
// winPart). (One kernel a head looping over the parts was 0.034 ms at 128k: 32 CTAs; the
// parts and the sum as two launches, 0.014 + 0.009 ms.)
extern "C" __global__ void proxy_cstruct(const float* bins, const float* pm, const float* rowLse2, float* winPart,
                                         unsigned* tickets, double* out, int b, int B, int nParts) {
  __shared__ double red[256];
  __shared__ bool last;
  const int part = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int lgB = B == 128 ? 7 : 6;
  const int NV = PART_KEYS >> lgB, SB = NV + 3, NS = NV + SB + 1;
  const float invB = 1.f / (float)b;
  const float sum = fused_bin_sum([&](int r) { return fused_row_weight(pm, rowLse2, h, b, r, part, nParts, invB); },
                                  bins + (((size_t)h * nParts + part) * NS + NS - 1) * b, b);
  if (lane == 0) {
    winPart[(size_t)h * nParts + part] = sum;
    // the part's sum is visible device-wide before its ticket is taken
    __threadfence();
    last = atomicAdd(&tickets[h], 1u) == (unsigned)nParts - 1;
  }
  __syncwarp();
  if (!last) return;
  __threadfence();
  const float* wp = winPart + (size_t)h * nParts;
  for (int v = lane; v < 256; v += 32) {
    double a = 0.0;
    for (int p = v; p < nParts; p += 256) a += __ldcg(wp + p);
    red[v] = a;
  }
  __syncwarp();
  for (int w = 128; w > 0; w >>= 1) {
    for (int v = lane; v < w; v += 32) red[v] += red[v + w];
    __syncwarp();
  }
  if (lane == 0) out[h] = red[0];
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

// Per (block J, head h), one warp (4 blocks a CTA of 128 threads, no barriers): p_v[J] =
// Σ_{j in J} a_v[j]; a_s[o] for the block's offsets, gathered from the (at most two) parts
// whose offset range holds o, in part order (written out only when asked for), and p_s[J]
// = their sum; FlexPrefill's pooled logit mean(Q̂) · K̄_J · scale. f64: each lane sums its
// tokens (lane, lane + 32, ...) in order, then a butterfly over the lanes (every lane ends
// with the same value); out is the host's f64 buffer.
extern "C" __global__ void proxy_blocks(const float* av, const float* slashPart, const float* qMean,
                                       const float* kMean, float* as, double* out, int n, int H, int Hkv, int b,
                                       int B, int nParts, int D, float scale, int Nb) {
  const int J = blockIdx.x * 4 + (threadIdx.x >> 5), h = blockIdx.y, lane = threadIdx.x & 31;
  if (J >= Nb) return;  // whole warps
  const int kvh = h / (H / Hkv);
  const int SP = PART_KEYS + B;
  double v = 0.0, sl = 0.0, lg = 0.0;
  for (int t = lane; t < B; t += 32) {
    const int o = J * B + t;
    if (o >= n) break;
    v += av[(size_t)h * n + o];
    // part p covers offsets [n − b − PART_KEYS·p − (PART_KEYS − 1), n − 1 − PART_KEYS·p]
    int pHi = (n - 1 - o) / PART_KEYS;
    if (pHi > nParts - 1) pHi = nParts - 1;
    const int lo = n - b - (PART_KEYS - 1) - o;  // need PART_KEYS·p >= lo
    const int pLo = lo <= 0 ? 0 : (lo + PART_KEYS - 1) / PART_KEYS;
    float sum = 0.f;
    for (int p = pLo; p <= pHi; p++) {
      const int oMin = n - b - p * PART_KEYS - (PART_KEYS - 1);
      sum += slashPart[((size_t)h * nParts + p) * SP + (o - oMin)];
    }
    if (as != nullptr) as[(size_t)h * n + o] = sum;
    sl += sum;
  }
  for (int d = lane; d < D; d += 32) {
    lg += (double)qMean[(size_t)h * D + d] * (double)kMean[((size_t)kvh * Nb + J) * D + d];
  }
  v = warp_sum(v);
  sl = warp_sum(sl);
  lg = warp_sum(lg);
  if (lane == 0) {
    const size_t HNb = (size_t)H * Nb;
    out[2 * H + (size_t)h * Nb + J] = v;
    out[2 * H + HNb + (size_t)h * Nb + J] = sl;
    out[2 * H + 2 * HNb + (size_t)h * Nb + J] = lg * (double)scale;  // logits; proxy_heads normalises
  }
}

// Block-level statistics from pass 2b, per (block J, head h): p_v[J] as pass 2b wrote it,
// p_s[J] = Σ over the parts whose offset blocks include J, in part order (each lane takes
// parts lane, lane + 32, ...; f64, then a butterfly), the pooled logit as in proxy_blocks (0
// when qMean is null: the lean pass wrote no means, the pooled estimate is not wanted).
// One warp takes BB_J consecutive blocks, its loads for all of them in flight together (one
// block a warp was a chain of load latencies: 0.017 ms at 128k); each block's sums
// are the same adds in the same order as before, so the same bits. Grid [ceil(Nb / (4·BB_J)),
// H], 128 threads.
#define BB_J 4
extern "C" __global__ void __launch_bounds__(128) proxy_blocks_b(const float* pv, const float* slashPart,
                                                                  const float* qMean, const float* kMean, double* out,
                                                                  int n, int H, int Hkv, int b, int B, int nParts,
                                                                  int D, float scale, int Nb) {
  CRISP_PDL_ENTRY();
  const int J0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * BB_J, h = blockIdx.y, lane = threadIdx.x & 31;
  if (J0 >= Nb) return;  // whole warps
  const int kvh = h / (H / Hkv);
  const int lgB = B == 128 ? 7 : 6;
  const int SB = PART_KEYS / B + 3;
  // lane j < BB_J writes block J0 + j's outputs: its p_v first
  const float pvj = lane < BB_J && J0 + lane < Nb ? pv[(size_t)h * Nb + J0 + lane] : 0.f;
  double sl[BB_J], lg[BB_J];
#pragma unroll
  for (int j = 0; j < BB_J; j++) sl[j] = lg[j] = 0.0;
  const float* sp = slashPart + (size_t)h * nParts * SB;
  for (int p = lane; p < nParts; p += 32) {
    const int i0 = J0 - ((n - b - p * PART_KEYS - (PART_KEYS - 1)) >> lgB);
#pragma unroll
    for (int j = 0; j < BB_J; j++) {
      if (i0 + j >= 0 && i0 + j < SB) sl[j] += (double)sp[(size_t)p * SB + i0 + j];
    }
  }
  for (int d = lane; qMean != nullptr && d < D; d += 32) {
    const double qd = (double)qMean[(size_t)h * D + d];
#pragma unroll
    for (int j = 0; j < BB_J; j++) {
      if (J0 + j < Nb) lg[j] += qd * (double)kMean[((size_t)kvh * Nb + J0 + j) * D + d];
    }
  }
#pragma unroll
  for (int j = 0; j < BB_J; j++) {
    sl[j] = warp_sum(sl[j]);
    if (qMean != nullptr) lg[j] = warp_sum(lg[j]);  // (else 0, as the sum of zeros was)
  }
  const size_t HNb = (size_t)H * Nb;
#pragma unroll
  for (int j = 0; j < BB_J; j++) {
    if (lane == j && J0 + j < Nb) {
      const size_t at = (size_t)h * Nb + J0 + j;
      out[2 * H + at] = (double)pvj;
      out[2 * H + HNb + at] = sl[j];
      out[2 * H + 2 * HNb + at] = lg[j] * (double)scale;  // logits; proxy_heads normalises
    }
  }
}

// Per head, 256 threads, f64: C_struct = the mass of a_v over the sink (j < wSink) and the
// local window (j >= n − wLocal), each key counted once where the two overlap (short n), as
// the reference does (from pass 2b's per-part window sums when winPart is given; neither av
// nor winPart: left as proxy_cstruct wrote it); the mean row entropy (0 when rowEntropy is
// null: the lean pass, no entropy wanted); the pooled estimate softmax_J of the logits
// proxy_blocks left in place. out = [C_struct H][entropy H][p_v H·Nb][p_s H·Nb][pooled H·Nb].
extern "C" __global__ void proxy_heads(const float* av, const float* winPart, const float* rowEntropy, double* out,
                                      int n, int H, int b, int Nb, int wSink, int wLocal, int nParts) {
  __shared__ double red[2][256];
  const int h = blockIdx.x, t = threadIdx.x;
  const int s0 = wSink < n ? wSink : n, l0 = n - wLocal > 0 ? n - wLocal : 0;
  double a = 0.0, e = 0.0;
  if (winPart != nullptr) {
    for (int p = t; p < nParts; p += 256) a += winPart[(size_t)h * nParts + p];
  } else if (av != nullptr) {
    for (int j = t; j < s0; j += 256) a += av[(size_t)h * n + j];
    for (int j = (l0 > s0 ? l0 : s0) + t; j < n; j += 256) a += av[(size_t)h * n + j];
  }
  for (int r = t; rowEntropy != nullptr && r < b; r += 256) e += rowEntropy[(size_t)h * b + r];
  red[0][t] = a;
  red[1][t] = e;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (t < w) {
      red[0][t] += red[0][t + w];
      red[1][t] += red[1][t + w];
    }
    __syncthreads();
  }
  if (t == 0) {
    // neither av nor winPart: C_struct came from proxy_cstruct
    if (av != nullptr || winPart != nullptr) out[h] = red[0][0];
    out[H + h] = red[1][0] / (double)b;
  }
  __syncthreads();
  double* lg = out + 2 * H + 2 * (size_t)H * Nb + (size_t)h * Nb;
  double m = __longlong_as_double(0xfff0000000000000ULL);  // -inf
  for (int J = t; J < Nb; J += 256) m = fmax(m, lg[J]);
  red[0][t] = m;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (t < w) red[0][t] = fmax(red[0][t], red[0][t + w]);
    __syncthreads();
  }
  m = red[0][0];
  double s = 0.0;
  for (int J = t; J < Nb; J += 256) s += exp(lg[J] - m);
  red[1][t] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (t < w) red[1][t] += red[1][t + w];
    __syncthreads();
  }
  s = red[1][0];
  for (int J = t; J < Nb; J += 256) lg[J] = exp(lg[J] - m) / s;
}

// Non-finite values of the statistics buffer, counted into *flag (zeroed first; a count, so
// the order of the atomic adds does not change it): the host reads it with the buffer and
// scans its copy only when it is not 0, to name the first bad statistic.
extern "C" __global__ void count_nonfinite_f64(const double* x, int count, double* flag) {
  int c = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) c += !isfinite(x[i]);
  c = warp_sum(c);
  if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(flag, (double)c);
}

// Mean over rows of each block, per head, in f32: out [heads][Nb][D]. rowsFrom/count
// select a row range (the proxy rows for the mean query); grid (Nb, heads), D threads.
template <bool BF16>
__device__ __forceinline__ void block_means_body(const u16* x, float* out, int rows, int heads, int D, int B,
                                                 int rowsFrom) {
  const int J = blockIdx.x, h = blockIdx.y, Nb = gridDim.x, d = threadIdx.x;
  const int r0 = rowsFrom + J * B;
  int r1 = r0 + B;
  if (r1 > rows) r1 = rows;
  float s = 0.f;
  for (int r = r0; r < r1; r++) s += to_f32<BF16>(x[((size_t)r * heads + h) * D + d]);
  out[((size_t)h * Nb + J) * D + d] = s / (float)(r1 - r0);
}
extern "C" __global__ void block_means_bf16(const u16* x, float* out, int rows, int heads, int D, int B, int from) {
  block_means_body<true>(x, out, rows, heads, D, B, from);
}
extern "C" __global__ void block_means_f16(const u16* x, float* out, int rows, int heads, int D, int B, int from) {
  block_means_body<false>(x, out, rows, heads, D, B, from);
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
