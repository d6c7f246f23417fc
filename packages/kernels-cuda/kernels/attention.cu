// Block-sparse and dense causal flash attention (FlashAttention-2 structure).
//
// Shape legend: q [n, H, D], k and v [n, Hkv, D], o [n, H, D] (bf16 or f16), lse [H, n] f32.
// B block size (64 or 128) = the query rows of one CTA (B / 16 warps, 16 rows each);
// keys stream through shared memory in 64-row tiles (a 128 block is two tiles), double
// buffered with cp.async. S = Q K^T and O += P V run on tensor cores (mma.sync m16n8k16,
// fragments through ldmatrix), softmax is online in fp32 (exp2 with the scale folded in).
// One CTA per (head, query block I); rowPtr/cols (BSR, per head h row h * Nb + I) list the
// key blocks, or rowPtr == nullptr means every J <= I (the dense baseline). Query head h
// reads kv head h / (H / Hkv): GQA without copies. Causal masking only where a key tile
// reaches past a warp's first row (the diagonal block).
#include "crisp-common.cuh"

template <int D, int NW, bool BF16>
__device__ __forceinline__ void attention_body(const u16* __restrict__ q, const u16* __restrict__ k,
                                               const u16* __restrict__ v, u16* __restrict__ o,
                                               float* __restrict__ lse, const int* __restrict__ rowPtr,
                                               const int* __restrict__ cols, int n, int H, int Hkv,
                                               float scaleLog2) {
  constexpr int BM = NW * 16;  // = B
  constexpr int BN = 64;
  constexpr int ROWB = D * 2;
  constexpr int CH = D / 8;  // 16-byte chunks per row
  constexpr int NT = NW * 32;
  constexpr int TPB = BM / BN;  // key tiles per block
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 sQ = smem_addr(smem);
  const u32 sK = sQ + BM * ROWB;
  const u32 sV = sK + 2 * BN * ROWB;

  const int h = blockIdx.x;
  const int Nb = gridDim.y;
  const int I = Nb - 1 - (int)blockIdx.y;  // longest rows first: better tail balance
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int q0 = I * BM;
  const size_t qStride = (size_t)H * D, kStride = (size_t)Hkv * D;

  for (int c = tid; c < BM * CH; c += NT) {
    const int r = c / CH, ch = c % CH, row = q0 + r;
    const u16* src = q + (size_t)(row < n ? row : n - 1) * qStride + (size_t)h * D + ch * 8;
    cp_async16(sQ + swz(r, ch, ROWB), src, row < n ? 16 : 0);
  }
  int first = 0, nBlocks = I + 1;
  if (rowPtr != nullptr) {
    first = rowPtr[h * Nb + I];
    nBlocks = rowPtr[h * Nb + I + 1] - first;
  }
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

  float acc[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float mA = CRISP_NEG_INF, mB = CRISP_NEG_INF, lA = 0.f, lB = 0.f;
  const int rowA = q0 + warp * 16 + (lane >> 2), rowB = rowA + 8;
  u32 qf[D / 16][4];

  for (int t = 0; t < nTiles; t++) {
    cp_async_wait<0>();
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++)
        ldsm_x4(qf[kk], sQ + swz(warp * 16 + (lane & 15), kk * 2 + (lane >> 4), ROWB));
    }
    if (t + 1 < nTiles) loadKV(t + 1, (t + 1) & 1);
    cp_async_commit();
    const u32 kBase = sK + (t & 1) * BN * ROWB, vBase = sV + (t & 1) * BN * ROWB;
    const int ks = tileStart(t);

    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
      for (int np = 0; np < 4; np++) {
        u32 b[4];
        ldsm_x4(b, kBase + swz(np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
        mma16816<BF16>(s[2 * np], qf[kk], b[0], b[1]);
        mma16816<BF16>(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }
    const bool needMask = ks + BN - 1 > q0 + warp * 16;
    float mxA = CRISP_NEG_INF, mxB = CRISP_NEG_INF;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = ks + j * 8 + (lane & 3) * 2 + e;
        float a = s[j][e] * scaleLog2, b = s[j][2 + e] * scaleLog2;
        if (needMask) {
          if (col > rowA) a = CRISP_NEG_INF;
          if (col > rowB) b = CRISP_NEG_INF;
        }
        s[j][e] = a;
        s[j][2 + e] = b;
        mxA = fmaxf(mxA, a);
        mxB = fmaxf(mxB, b);
      }
    }
    mxA = quad_max(mxA);
    mxB = quad_max(mxB);
    const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
    // A row with no visible key yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
    const float uA = nA == CRISP_NEG_INF ? 0.f : nA, uB = nB == CRISP_NEG_INF ? 0.f : nB;
    const float cA = exp2f(mA - uA), cB = exp2f(mB - uB);
    mA = nA;
    mB = nB;
    float sumA = 0.f, sumB = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      s[j][0] = exp2f(s[j][0] - uA);
      s[j][1] = exp2f(s[j][1] - uA);
      s[j][2] = exp2f(s[j][2] - uB);
      s[j][3] = exp2f(s[j][3] - uB);
      sumA += s[j][0] + s[j][1];
      sumB += s[j][2] + s[j][3];
    }
    lA = lA * cA + sumA;
    lB = lB * cB + sumB;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      acc[j][0] *= cA;
      acc[j][1] *= cA;
      acc[j][2] *= cB;
      acc[j][3] *= cB;
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      u32 a[4];
      a[0] = pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {
        u32 b[4];
        ldsm_x4_t(b, vBase + swz(kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7), dp * 2 + (lane >> 4), ROWB));
        mma16816<BF16>(acc[2 * dp], a, b[0], b[1]);
        mma16816<BF16>(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  lA = quad_sum(lA);
  lB = quad_sum(lB);
  const float iA = lA > 0.f ? 1.f / lA : 0.f, iB = lB > 0.f ? 1.f / lB : 0.f;
#pragma unroll
  for (int j = 0; j < D / 8; j++) {
    const int col = j * 8 + (lane & 3) * 2;
    if (rowA < n)
      *reinterpret_cast<u32*>(o + (size_t)rowA * qStride + (size_t)h * D + col) =
          pack2<BF16>(acc[j][0] * iA, acc[j][1] * iA);
    if (rowB < n)
      *reinterpret_cast<u32*>(o + (size_t)rowB * qStride + (size_t)h * D + col) =
          pack2<BF16>(acc[j][2] * iB, acc[j][3] * iB);
  }
  if (lse != nullptr && (lane & 3) == 0) {
    const float ln2 = 0.6931471805599453f;
    if (rowA < n) lse[(size_t)h * n + rowA] = lA > 0.f ? (mA + log2f(lA)) * ln2 : CRISP_NEG_INF;
    if (rowB < n) lse[(size_t)h * n + rowB] = lB > 0.f ? (mB + log2f(lB)) * ln2 : CRISP_NEG_INF;
  }
}

#define CRISP_ATTN(NAME, D, NW, BF16)                                                                     \
  extern "C" __global__ void __launch_bounds__(NW * 32, 1)                                                \
      NAME(const u16* q, const u16* k, const u16* v, u16* o, float* lse, const int* rowPtr, const int* cols, \
           int n, int H, int Hkv, float scaleLog2) {                                                        \
    attention_body<D, NW, BF16>(q, k, v, o, lse, rowPtr, cols, n, H, Hkv, scaleLog2);                   \
  }

CRISP_ATTN(attn_bf16_d64_b64, 64, 4, true)
CRISP_ATTN(attn_bf16_d64_b128, 64, 8, true)
CRISP_ATTN(attn_bf16_d128_b64, 128, 4, true)
CRISP_ATTN(attn_bf16_d128_b128, 128, 8, true)
CRISP_ATTN(attn_f16_d64_b64, 64, 4, false)
CRISP_ATTN(attn_f16_d64_b128, 64, 8, false)
CRISP_ATTN(attn_f16_d128_b64, 128, 4, false)
CRISP_ATTN(attn_f16_d128_b128, 128, 8, false)
