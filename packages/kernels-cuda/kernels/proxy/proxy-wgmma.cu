// Proxy statistics on Hopper's warpgroup MMA (sm_90a only): pass 1 and pass 2b of proxy.cu,
// same arguments and outputs, with S = Q̂ K_tᵀ from wgmma.mma_async m64n64k16. Q̂ and the
// K tiles are read by the tensor cores from shared memory through matrix descriptors (the
// panelled 128-byte swizzle of attention-wgmma.cu, wgmma.cuh), so a warp issues no ldmatrix,
// no mma.sync and no per-lane fragment addressing for its scores: what is left in its
// instruction stream is the per-score softmax work. (On the mma.sync passes Nsight Compute
// counted 15.5 instructions a score, about half of them neither the MMAs nor the
// softmax.)
//
// One CTA per (head, part of PART_KEYS keys), heads fastest, NWG = B / 64 warpgroups of 64
// proxy rows (warp w holds rows 16w .. 16w + 15); 64-key tiles in ST cp.async stages issued
// by all threads, one barrier a tile. Per warp the m64n64k16 accumulator is the m16n8
// fragment s[8][4] of its 16 rows, so pass 1's online update and pass 2b's sums are the
// shared ones (proxy-common.cuh), and pass 1 also takes the key block means and the proxy
// query mean from the tiles in shared memory, as proxy.cu does.
//
// Built only for sm_90a; elsewhere the entries are empty stubs that the backend never
// launches (it runs proxy.cu's layouts off Hopper).
#include "../common/crisp-common.cuh"
#include "../common/wgmma.cuh"
#include "proxy-common.cuh"

#ifdef CRISP_WGMMA
// issue_s (wgmma.cuh) with the k-steps' descriptors as the first step's plus a constant:
// the address field is (addr & 0x3FFFF) >> 4 in the low 14 bits, and every operand lies
// below 256 KiB of shared memory, so adding (offset >> 4) never carries out of it. Two
// descriptors a tile instead of sixteen (the pass is issue-bound).
template <int D, int BN, int BM, bool BF16>
__device__ __forceinline__ void proxy_issue_s(float* s, u32 qBase, u32 kBase) {
  const u64 da = gmma_desc(qBase, 16, 1024), db = gmma_desc(kBase, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const u32 pOff = (kk & 3) * 32;  // 16 columns = 32 bytes inside a panel
    wgmma_ss<BN, BF16>(s, da + (((kk >> 2) * BM * 128 + pOff) >> 4), db + (((kk >> 2) * BN * 128 + pOff) >> 4),
                       kk > 0 ? 1 : 0);
  }
}

// LEAN (the fused pass only): no key block means, no proxy query mean and no entropy sums
// (the pooled estimate and the row entropy are not wanted).
template <int D, int NWG, bool BF16, bool PASS1, int ST, bool FUSED = false, bool LEAN = false>
__device__ __forceinline__ void proxy_wg_body(const u16* __restrict__ q, const u16* __restrict__ k, float* pm,
                                              float* pl, float* pt, float* qMean, float* kMean,
                                              const float* rowLse2, float* pv, float* slashPart, float* winPart,
                                              float* bins, int n, int H, int Hkv, int b, int qOff, float scaleLog2,
                                              int wSink, int wLocal) {
  // (the kernel after it, proxy_combine, is launched programmatically: CRISP_PDL_ENTRY)
  pdl_trigger();
  constexpr int BM = 64 * NWG, NT = NWG * 128, NW = NWG * 4, CH = D / 8;
  constexpr int LGB = BM == 128 ? 7 : 6;
  constexpr u32 QBYTES = BM * D * 2, TBYTES = 64 * D * 2;
  constexpr int NV = PART_KEYS / BM, SB = PART_KEYS / BM + 3;
  // block means as in proxy.cu: each column of a tile in two 32-row chunks
  constexpr int KCH = 2, TPC = NT / D >= KCH ? KCH : NT / D, CPT = KCH / TPC, TPB = BM / 64;
  static_assert(NT >= D, "the block means give each thread one column");
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 base = smem_addr(smem);
  const u32 sQ = (base + 1023u) & ~1023u;  // the host adds 1024 bytes of slack
  const u32 sK = sQ + QBYTES;
  const unsigned char* gQ = smem + (sQ - base);
  const unsigned char* gK = smem + (sK - base);
  // pass 1: kred [2 parities][KCH][D] (fused: then tup [PART_TILES][P1F_SLOTS][BM]); pass 2b:
  // red [2 parities][NW][P2B_VALS], acc [NV | SB | 1]
  float* fs = reinterpret_cast<float*>(smem + (sK - base) + ST * TBYTES);
  float* red = fs;
  float* acc = fs + 2 * NW * P2B_VALS;
  float* tup = fs + 2 * KCH * D;
  static_assert(!FUSED || PASS1, "the fused pass is pass 1 with the block sums");
  static_assert(!LEAN || FUSED, "the lean pass is a fused pass");
  const int h = blockIdx.x, part = blockIdx.y, nParts = gridDim.y;
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // the warpgroup as a value the compiler knows is warp-uniform (a shuffle from lane 0): its
  // Q descriptors then stay in uniform registers instead of being moved there at each k-step
  // (two R2URs and two moves a k-step, ~40 instructions a tile in the SASS)
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  const int posA = n - b + rA, posB = n - b + rB;
  const int ps = part * PART_KEYS;
  int nT = (n - ps + 63) / 64;
  if (nT > PART_TILES) nT = PART_TILES;
  const size_t kStride = (size_t)Hkv * D;
  // A thread's 16-byte chunks of a tile: column chunk lch of rows lr + i·RSTEP, at fixed
  // offsets from the tile's base (RSTEP is a multiple of 8, so the swizzle term is the same
  // for all of them): the addresses are computed once, not per tile (Nsight Compute counted
  // ~29 instructions a chunk when they were).
  constexpr int RSTEP = NT / CH, LOADS = 64 / RSTEP;
  static_assert(NT % CH == 0 && RSTEP % 8 == 0 && 64 % RSTEP == 0, "a thread's chunks share one swizzle term");
  const int lr = tid / CH, lch = tid % CH;
  const u32 dOff = pswz(64, lr, lch);
  const u16* kBaseG = k + (size_t)kvh * D + lch * 8;
  // Tiles are loaded in order, one at a time (t = 0, 1, ...): the source of a full tile's
  // first chunk is a pointer advanced by a tile each call, not a 64-bit product a tile (the
  // loads' address arithmetic was ~22 instructions a tile in the SASS)
  const u16* kNext = kBaseG + (size_t)(ps + lr) * kStride;
  const size_t kTileStep = (size_t)64 * kStride, kChunkStep = (size_t)RSTEP * kStride;
  auto loadK = [&](int t) {
    const int ks = ps + t * 64;
    const u32 dst = sK + (t % ST) * TBYTES + dOff;
    if (ks + 64 <= n) {
#pragma unroll
      for (int i = 0; i < LOADS; i++) cp_async16(dst + i * RSTEP * 128, kNext + i * kChunkStep, 16);
      kNext += kTileStep;
    } else {
#pragma unroll
      for (int i = 0; i < LOADS; i++) {
        const int key = ks + lr + i * RSTEP;
        cp_async16(dst + i * RSTEP * 128, kBaseG + (size_t)(key < n ? key : n - 1) * kStride, key < n ? 16 : 0);
      }
    }
  };
  // the proxy rows n − b .. n − 1 (rows past b land as zeros), q's rows from position qOff
  // (chunked prefill: q holds positions qOff .. n − 1)
  stage_q<BM, D, NT>(q, n - b, n, qOff, (size_t)H * D, h, tid, [&](int r, int ch) { return sQ + pswz(BM, r, ch); });
  // ST − 1 tiles ahead: group g holds tile g (group 0 also Q)
#pragma unroll
  for (int t = 0; t < ST - 1; t++) {
    if (t < nT) loadK(t);
    cp_async_commit();
  }

  // pass 1 state
  float mA = CRISP_NEG_INF, mB = CRISP_NEG_INF, lA = 0.f, lB = 0.f, tA = 0.f, tB = 0.f;
  // each part's key block means by one head of the kv group, in turn (part % G): the same
  // sums, spread over the group instead of all in the CTAs of its first head
  const bool doMeans = PASS1 && !LEAN && h % (H / Hkv) == part % (H / Hkv);
  const int kd = tid % D, khalf = tid / D;
  const int Nb = (n + BM - 1) / BM;
  float ksum[CPT];
#pragma unroll
  for (int c = 0; c < CPT; c++) ksum[c] = 0.f;
  // pass 2b state
  const float lseA = !PASS1 && rA < b ? rowLse2[h * b + rA] : 0.f;
  const float lseB = !PASS1 && rB < b ? rowLse2[h * b + rB] : 0.f;
  const int opart0 = (n - b - ps - (PART_KEYS - 1)) >> LGB;
  const int s0 = wSink < n ? wSink : n, l0 = n - wLocal > 0 ? n - wLocal : 0;
  if (!PASS1) {
    for (int i = tid; i < NV + SB + 1; i += NT) acc[i] = 0.f;
  }

  float s[32];
#pragma unroll
  for (int i = 0; i < 32; i++) s[i] = 0.f;
  const u32 qBase = sQ + wg * 64 * 128;
  // Iteration tt: tile tt has landed and every thread is done with tile tt − 1, whose stage
  // takes tile tt + ST − 1. Pass 2b runs one more iteration to combine the last tile.
  for (int tt = 0; tt < nT + (PASS1 ? 0 : 1); tt++) {
    cp_async_wait<ST - 2>();
    fence_proxy_async();
    __syncthreads();
    if (tt + ST - 1 < nT) loadK(tt + ST - 1);
    cp_async_commit();
    const int ks = ps + tt * 64;
    if (PASS1) {
      if (tt == 0) {
        if (!LEAN && part == 0 && tid < D) {
          float sum = 0.f;
          for (int r = 0; r < b; r++) {
            sum += to_f32<BF16>(*reinterpret_cast<const u16*>(gQ + pswz(BM, r, tid >> 3) + (tid & 7) * 2));
          }
          qMean[(size_t)h * D + tid] = sum / (float)b;
        }
      } else if (doMeans && khalf == 0 && (tt - 1) % TPB == TPB - 1) {
        // the block that ended at tile tt − 1: its chunk partials were written before the barrier
        p1_write_kmean<KCH, BM>(fs + ((((tt - 1) / TPB) & 1) * KCH) * D, kMean, kvh, Nb, (ks - 64) / BM, kd, D, n);
      }
    }
    if (tt < nT) {
      const u32 kBase = sK + (tt % ST) * TBYTES;
      reg_fence<32>(s);
      wgmma_fence();
      proxy_issue_s<D, 64, BM, BF16>(s, qBase, kBase);
      wgmma_commit();
      wgmma_wait0();
      reg_fence<32>(s);
      float(&sf)[8][4] = *reinterpret_cast<float(*)[8][4]>(s);
      const bool edge = ks + 63 > n - b || b < BM;
      if (PASS1) {
        if (doMeans && khalf < TPC) {
          const unsigned char* kt = gK + (tt % ST) * TBYTES;
          const bool blockEnd = tt % TPB == TPB - 1 || tt == nT - 1;
          p1_kmean_tile<BF16, CPT>(ksum, fs + (((tt / TPB) & 1) * KCH) * D, khalf, kd, D, blockEnd,
                                   [&](int r) { return kt + pswz(64, r, kd >> 3); });
        }
        constexpr int LGF = FUSED ? LGB : 0;
        float split[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        const bool win = FUSED && (ks < s0 || ks + 63 >= l0);
        if (edge || win) {
          proxy_p1_update<true, LGF, !LEAN>(sf, ks, rA, rB, posA, posB, b, scaleLog2, mA, mB, lA, lB, tA, tB, split, s0, l0, win);
        } else {
          proxy_p1_update<false, LGF, !LEAN>(sf, ks, rA, rB, posA, posB, b, scaleLog2, mA, mB, lA, lB, tA, tB, split, s0, l0, win);
        }
        if (FUSED) p1f_stash<BM>(tup, tt, rA, rB, mA, mB, split, win);
      } else {
        const int obase = (n - b - ks - 63) >> LGB;
        float bins[3] = {0.f, 0.f, 0.f};
        p2b_rows<LGB>(sf, ks, b, posA, posB, rA < b, rB < b, lseA, lseB, edge, obase, scaleLog2, bins);
        const float w = ks < s0 || ks + 63 >= l0 ? p2b_window(sf, ks, s0, l0) : 0.f;
        p2b_stash<NW>(red, tt & 1, bins, w);
      }
    }
    if (!PASS1 && tt >= 1) p2b_combine<NW, LGB>(red, (tt - 1) & 1, ks - 64, ps, n, b, opart0, acc, acc + NV, acc + NV + SB);
  }
  cp_async_wait<0>();
  __syncthreads();
  if (PASS1) {
    if (doMeans && khalf == 0) {
      // the last block (it ends at the last tile, full or not)
      const int tl = nT - 1;
      p1_write_kmean<KCH, BM>(fs + (((tl / TPB) & 1) * KCH) * D, kMean, kvh, Nb, (ps + tl * 64) / BM, kd, D, n);
    }
    // the part's bins, accumulated over the K stages (free after the last barrier)
    if (FUSED) p1f_sweep<LGB, BM, NT>(tup, reinterpret_cast<float*>(smem + (sK - base)), bins, h, part, nParts, ps, nT, n, b);
    p1_store_rows(pm, pl, pt, h, b, nParts, part, rA, rB, mA, mB, lA, lB, tA, tB, scaleLog2);
  } else {
    p2b_write<LGB, NV, SB, NT>(acc, pv, slashPart, winPart, h, part, nParts, ps, n, b);
  }
}
#define CRISP_PROXY_WG_CALL1(D, NWG, BF16) \
  proxy_wg_body<D, NWG, BF16, true, 2>(q, k, pm, pl, pt, qMean, kMean, nullptr, nullptr, nullptr, nullptr, nullptr, n, H, Hkv, b, qOff, scaleLog2, 0, 0);
#define CRISP_PROXY_WG_CALL2(D, NWG, BF16) \
  proxy_wg_body<D, NWG, BF16, false, 2>(q, k, nullptr, nullptr, nullptr, nullptr, nullptr, rowLse2, pv, slashPart, winPart, nullptr, n, H, Hkv, b, qOff, scaleLog2, wSink, wLocal);
#define CRISP_PROXY_WG_CALL1F(D, NWG, BF16) \
  proxy_wg_body<D, NWG, BF16, true, 2, true>(q, k, pm, pl, pt, qMean, kMean, nullptr, nullptr, nullptr, nullptr, bins, n, H, Hkv, b, qOff, scaleLog2, wSink, wLocal);
#define CRISP_PROXY_WG_CALL1L(D, NWG, BF16) \
  proxy_wg_body<D, NWG, BF16, true, 2, true, true>(q, k, pm, pl, pt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, bins, n, H, Hkv, b, qOff, scaleLog2, wSink, wLocal);
#else
#define CRISP_PROXY_WG_CALL1(D, NWG, BF16)
#define CRISP_PROXY_WG_CALL2(D, NWG, BF16)
#define CRISP_PROXY_WG_CALL1F(D, NWG, BF16)
#define CRISP_PROXY_WG_CALL1L(D, NWG, BF16)
#endif  // CRISP_WGMMA

// A fused pass's entry (the full one and the lean one take the same arguments).
#define CRISP_PROXY_WG_FUSED(NAME, CALL, D, NWG, BF16)                                                           \
  extern "C" __global__ void __launch_bounds__(NWG * 128, 2)                                                     \
      NAME(const u16* q, const u16* k, float* pm, float* pl, float* pt, float* qMean, float* kMean, float* bins,  \
           int n, int H, int Hkv, int b, int qOff, float scaleLog2, int wSink, int wLocal) {                     \
    CALL(D, NWG, BF16)                                                                                           \
  }

// `proxy_wg_pass1_<dtype>_d<D>_b<B>` and `proxy_wg_pass2b_...`: the arguments of proxy.cu's
// pass 1 and pass 2b; B / 64 warpgroups; two stages of 64-key tiles. `proxy_wg_pass1f_...`
// the fused pass, `proxy_wg_pass1l_...` the lean fused pass (the same arguments; it writes
// neither qMean nor kMean, and pt stays 0).
#define CRISP_PROXY_WG(SUF, D, NWG, BF16)                                                                        \
  extern "C" __global__ void __launch_bounds__(NWG * 128, 2)                                                     \
      proxy_wg_pass1_##SUF(const u16* q, const u16* k, float* pm, float* pl, float* pt, float* qMean,            \
                           float* kMean, int n, int H, int Hkv, int b, int qOff, float scaleLog2) {              \
    CRISP_PROXY_WG_CALL1(D, NWG, BF16)                                                                           \
  }                                                                                                              \
  CRISP_PROXY_WG_FUSED(proxy_wg_pass1f_##SUF, CRISP_PROXY_WG_CALL1F, D, NWG, BF16)                              \
  CRISP_PROXY_WG_FUSED(proxy_wg_pass1l_##SUF, CRISP_PROXY_WG_CALL1L, D, NWG, BF16)                              \
  extern "C" __global__ void __launch_bounds__(NWG * 128, 2)                                                     \
      proxy_wg_pass2b_##SUF(const u16* q, const u16* k, const float* rowLse2, float* pv, float* slashPart,       \
                            float* winPart, int n, int H, int Hkv, int b, int qOff, float scaleLog2, int wSink,   \
                            int wLocal) {                                                                        \
    CRISP_PROXY_WG_CALL2(D, NWG, BF16)                                                                           \
  }

CRISP_PROXY_WG(bf16_d64_b64, 64, 1, true)
CRISP_PROXY_WG(bf16_d64_b128, 64, 2, true)
CRISP_PROXY_WG(bf16_d128_b64, 128, 1, true)
CRISP_PROXY_WG(bf16_d128_b128, 128, 2, true)
CRISP_PROXY_WG(f16_d64_b64, 64, 1, false)
CRISP_PROXY_WG(f16_d64_b128, 64, 2, false)
CRISP_PROXY_WG(f16_d128_b64, 128, 1, false)
CRISP_PROXY_WG(f16_d128_b128, 128, 2, false)
