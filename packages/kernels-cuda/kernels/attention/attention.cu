// Block-sparse and dense causal flash attention (FlashAttention-2 structure).
//
// Shape legend: q [m, H, D] (the last m of n positions; m = n outside chunked prefill),
// k and v [n, Hkv, D], o [m, H, D] (bf16 or f16), lse [H, m] f32.
// B block size (64 or 128) = the query rows of one CTA (B / 32 warps, 32 rows each);
// keys stream through shared memory in 64-row tiles (a 128 block is two tiles), double
// buffered with cp.async. S = Q K^T and O += P V run on tensor cores (mma.sync m16n8k16,
// fragments through ldmatrix), softmax is online in fp32 (exp2 with the scale folded in).
// One CTA per (head, query block I); rowPtr/cols (BSR, per head h row h * Nb + I) list the
// key blocks, or rowPtr == nullptr means every J <= I (the dense baseline). Query head h
// reads kv head h / (H / Hkv): GQA without copies. Causal masking only where a key tile
// reaches past a warp's first row (the diagonal block).
#include "../common/crisp-common.cuh"

template <int D, int NW, int MT, int BN, bool BF16>
__device__ __forceinline__ void attention_body(const u16* __restrict__ q, const u16* __restrict__ k,
                                               const u16* __restrict__ v, u16* __restrict__ o,
                                               float* __restrict__ lse, const int* __restrict__ rowPtr,
                                               const int* __restrict__ cols, int n, int m, int Nb, int H,
                                               int Hkv, float scaleLog2, const int* hsel, int hmode,
                                               size_t lseStride) {
  constexpr int WR = MT * 16;   // query rows per warp
  constexpr int BM = NW * WR;   // = B
  constexpr int ROWB = D * 2;
  constexpr int CH = D / 8;  // 16-byte chunks per row
  constexpr int NT = NW * 32;
  constexpr int TPB = BM / BN;  // key tiles per block
  // One m-tile per warp: Q fragments live in registers for the whole row. Two m-tiles:
  // they would take 64 more registers, so Q is re-read from shared memory each k-step
  // (each K/V fragment then feeds two MMAs instead of one: half the shared-memory
  // traffic per FLOP, which is what limits the one-m-tile version).
  constexpr bool QREG = MT == 1;
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 sQ = smem_addr(smem);
  const u32 sK = sQ + BM * ROWB;
  const u32 sV = sK + 2 * BN * ROWB;

  // Chunked prefill: the m queries are the last m of the n positions (off = n − m); the
  // grid covers query blocks from the one holding position off up to Nb − 1. Rows and
  // columns below are positions; q, o and lse are indexed by position − off.
  const int off = n - m;
  int h, I;
  if (!cta_order(Nb, hsel, hmode, h, I)) return;  // longest rows first: better tail balance
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int q0 = I * BM;
  const size_t qStride = (size_t)H * D, kStride = (size_t)Hkv * D;

  stage_q<BM, D, NT>(q, q0, n, off, qStride, h, tid, [&](int r, int ch) { return sQ + swz(r, ch, ROWB); });
  int first;
  const int nBlocks = row_blocks(rowPtr, h, Nb, I, first);
  const int nTiles = nBlocks * TPB;
  auto tileStart = [&](int t) -> int {
    const int blk = rowPtr != nullptr ? cols[first + t / TPB] : t / TPB;
    return blk * BM + (t % TPB) * BN;
  };
  auto loadKV = [&](int t, int stage) {
    const int ks = tileStart(t);
    for (int c = tid; c < BN * CH; c += NT) {
      const int r = c / CH, ch = c % CH, key = ks + r;
      const size_t off = (size_t)(key < n ? key : n - 1) * kStride + (size_t)kvh * D + ch * 8;
      const int bytes = key < n ? 16 : 0;
      cp_async16(sK + stage * BN * ROWB + swz(r, ch, ROWB), k + off, bytes);
      cp_async16(sV + stage * BN * ROWB + swz(r, ch, ROWB), v + off, bytes);
    }
  };
  if (nTiles > 0) loadKV(0, 0);
  cp_async_commit();

  float acc[MT][D / 8][4];
  float mA[MT], mB[MT], lA[MT], lB[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int j = 0; j < D / 8; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
    mA[mt] = mB[mt] = CRISP_NEG_INF;
    lA[mt] = lB[mt] = 0.f;
  }
  u32 qf[QREG ? D / 16 : 1][4];

  for (int t = 0; t < nTiles; t++) {
    cp_async_wait<0>();
    __syncthreads();
    if (QREG && t == 0) {
#pragma unroll
      for (int kk = 0; kk < (QREG ? D / 16 : 0); kk++)
        ldsm_x4(qf[kk], sQ + swz(warp * WR + (lane & 15), kk * 2 + (lane >> 4), ROWB));
    }
    if (t + 1 < nTiles) loadKV(t + 1, (t + 1) & 1);
    cp_async_commit();
    const u32 kBase = sK + (t & 1) * BN * ROWB, vBase = sV + (t & 1) * BN * ROWB;
    const int ks = tileStart(t);

    float s[MT][BN / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int j = 0; j < BN / 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      u32 qa[MT][4];
      if (!QREG) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
          ldsm_x4(qa[mt], sQ + swz(warp * WR + mt * 16 + (lane & 15), kk * 2 + (lane >> 4), ROWB));
      }
#pragma unroll
      for (int np = 0; np < BN / 16; np++) {
        u32 b[4];
        ldsm_x4(b, kBase + swz(np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          const u32(&a)[4] = QREG ? qf[QREG ? kk : 0] : qa[mt];
          mma16816<BF16>(s[mt][2 * np], a, b[0], b[1]);
          mma16816<BF16>(s[mt][2 * np + 1], a, b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const bool needMask = ks + BN - 1 > q0 + warp * WR + mt * 16;
      const int rA = q0 + warp * WR + mt * 16 + (lane >> 2), rB = rA + 8;
      float mxA = CRISP_NEG_INF, mxB = CRISP_NEG_INF;
      // Max over raw scores (scale > 0 commutes with max); the scale is applied inside one
      // FFMA per score below (s · scale − m), not a separate multiply and subtract.
#pragma unroll
      for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int col = ks + j * 8 + (lane & 3) * 2 + e;
          if (needMask) {
            if (col > rA) s[mt][j][e] = CRISP_NEG_INF;
            if (col > rB) s[mt][j][2 + e] = CRISP_NEG_INF;
          }
          mxA = fmaxf(mxA, s[mt][j][e]);
          mxB = fmaxf(mxB, s[mt][j][2 + e]);
        }
      }
      mxA = quad_max(mxA) * scaleLog2;
      mxB = quad_max(mxB) * scaleLog2;
      const float nA = fmaxf(mA[mt], mxA), nB = fmaxf(mB[mt], mxB);
      // A row with no visible key yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
      const float uA = nA == CRISP_NEG_INF ? 0.f : nA, uB = nB == CRISP_NEG_INF ? 0.f : nB;
      const float cA = exp2f(mA[mt] - uA), cB = exp2f(mB[mt] - uB);
      mA[mt] = nA;
      mB[mt] = nB;
      float sumA = 0.f, sumB = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; j++) {
        s[mt][j][0] = exp2f(fmaf(s[mt][j][0], scaleLog2, -uA));
        s[mt][j][1] = exp2f(fmaf(s[mt][j][1], scaleLog2, -uA));
        s[mt][j][2] = exp2f(fmaf(s[mt][j][2], scaleLog2, -uB));
        s[mt][j][3] = exp2f(fmaf(s[mt][j][3], scaleLog2, -uB));
        sumA += s[mt][j][0] + s[mt][j][1];
        sumB += s[mt][j][2] + s[mt][j][3];
      }
      lA[mt] = lA[mt] * cA + sumA;
      lB[mt] = lB[mt] * cB + sumB;
      // Once a row's running max settles (most tiles of a long row) the correction factors
      // are exactly 1: skip the D/2 multiplies when the whole warp has nothing to rescale.
      if (__any_sync(0xffffffffu, cA != 1.f || cB != 1.f)) {
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
          acc[mt][j][0] *= cA;
          acc[mt][j][1] *= cA;
          acc[mt][j][2] *= cB;
          acc[mt][j][3] *= cB;
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      u32 a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        a[mt][0] = pack2<BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {
        u32 b[4];
        ldsm_x4_t(b, vBase + swz(kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7), dp * 2 + (lane >> 4), ROWB));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma16816<BF16>(acc[mt][2 * dp], a[mt], b[0], b[1]);
          mma16816<BF16>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    const float la = quad_sum(lA[mt]), lb = quad_sum(lB[mt]);
    const int rA = q0 + warp * WR + mt * 16 + (lane >> 2), rB = rA + 8;
    const float iA = la > 0.f ? 1.f / la : 0.f, iB = lb > 0.f ? 1.f / lb : 0.f;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      const int col = j * 8 + (lane & 3) * 2;
      if (rA < n && rA >= off)
        *reinterpret_cast<u32*>(o + (size_t)(rA - off) * qStride + (size_t)h * D + col) =
            pack2<BF16>(acc[mt][j][0] * iA, acc[mt][j][1] * iA);
      if (rB < n && rB >= off)
        *reinterpret_cast<u32*>(o + (size_t)(rB - off) * qStride + (size_t)h * D + col) =
            pack2<BF16>(acc[mt][j][2] * iB, acc[mt][j][3] * iB);
    }
    if (lse != nullptr && (lane & 3) == 0) {
      const float ln2 = 0.6931471805599453f;
      if (rA < n && rA >= off) lse[(size_t)h * lseStride + (rA - off)] = la > 0.f ? (mA[mt] + log2f(la)) * ln2 : CRISP_NEG_INF;
      if (rB < n && rB >= off) lse[(size_t)h * lseStride + (rB - off)] = lb > 0.f ? (mB[mt] + log2f(lb)) * ln2 : CRISP_NEG_INF;
    }
  }
}

// w32: B / 32 warps of 32 rows (two m-tiles), 2 CTAs per SM (255 registers a thread by the
// launch bound). (A layout of B / 16 warps of 16 rows, and one with 32-key tiles, measured
// slower on the H200 and are not shipped; MT and BN stay template parameters.) Shared
// memory: Q (B rows) plus two stages of K and V tiles.
#define CRISP_ATTN(NAME, D, NW, MT, BN, BF16, MINB)                                                          \
  extern "C" __global__ void __launch_bounds__(NW * 32, MINB)                                             \
      NAME(const u16* q, const u16* k, const u16* v, u16* o, float* lse, const int* rowPtr, const int* cols, \
           int n, int m, int Nb, int H, int Hkv, float scaleLog2, const int* hsel, int hmode,               \
           const VarSeg* segs, int lseStride) {                                                             \
    if (!varlen_segment<D>(segs, q, k, v, o, lse, rowPtr, cols, n, m, Nb, H, Hkv)) return;                 \
    attention_body<D, NW, MT, BN, BF16>(q, k, v, o, lse, rowPtr, cols, n, m, Nb, H, Hkv, scaleLog2, hsel, hmode, \
                                        (size_t)lseStride);                                                 \
  }

CRISP_ATTN(attn_w32_bf16_d64_b64, 64, 2, 2, 64, true, 2)
CRISP_ATTN(attn_w32_bf16_d64_b128, 64, 4, 2, 64, true, 2)
CRISP_ATTN(attn_w32_bf16_d128_b64, 128, 2, 2, 64, true, 2)
CRISP_ATTN(attn_w32_bf16_d128_b128, 128, 4, 2, 64, true, 2)
CRISP_ATTN(attn_w32_f16_d64_b64, 64, 2, 2, 64, false, 2)
CRISP_ATTN(attn_w32_f16_d64_b128, 64, 4, 2, 64, false, 2)
CRISP_ATTN(attn_w32_f16_d128_b64, 128, 2, 2, 64, false, 2)
CRISP_ATTN(attn_w32_f16_d128_b128, 128, 4, 2, 64, false, 2)
