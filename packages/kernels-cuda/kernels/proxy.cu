// Fused proxy statistics. The proxy map Â[h] = softmax_j(Q̂ K_hᵀ · scale) (Q̂ = the last
// b = min(B, n) queries, causal) is never stored: pass 1 reduces each proxy row to its
// max, normaliser and Σ p·s (for the entropy), pass 2 recomputes the scores, normalises
// them and reduces them to the vertical token scores a_v[j] (column means) and slash
// token scores a_s[o] (means along diagonals, o = query position − key position).
//
// Shape legend: q [n, H, D], k [n, Hkv, D]; b <= B = NW * 16 proxy rows; one CTA per
// (part of PART = 512 keys, head); keys stream in 64-key tiles. Scores come from the
// tensor cores (mma.sync), everything after them is fp32. All reductions run in a fixed
// order (no float atomics), so the statistics are bit-for-bit reproducible.
#include "crisp-common.cuh"

#define PART_TILES 8
#define PART_KEYS (PART_TILES * 64)

template <int D, int NW, bool BF16>
__device__ __forceinline__ void proxy_scores(const u16* __restrict__ q, const u16* __restrict__ k,
                                             int n, int H, int Hkv, int b, int h, u32 sQ, u32 sK,
                                             int ks, float (&s)[8][4], u32 (&qf)[D / 16][4], bool loadQ) {
  constexpr int ROWB = D * 2, CH = D / 8, NT = NW * 32, BM = NW * 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kvh = h / (H / Hkv);
  if (loadQ) {
    for (int c = tid; c < BM * CH; c += NT) {
      const int r = c / CH, ch = c % CH, row = n - b + r;
      const bool ok = r < b;
      cp_async16(sQ + swz(r, ch, ROWB), q + (size_t)(ok ? row : n - 1) * H * D + (size_t)h * D + ch * 8, ok ? 16 : 0);
    }
  }
  for (int c = tid; c < 64 * CH; c += NT) {
    const int r = c / CH, ch = c % CH, key = ks + r;
    cp_async16(sK + swz(r, ch, ROWB), k + (size_t)(key < n ? key : n - 1) * Hkv * D + (size_t)kvh * D + ch * 8,
               key < n ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (loadQ) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ldsm_x4(qf[kk], sQ + swz(warp * 16 + (lane & 15), kk * 2 + (lane >> 4), ROWB));
  }
#pragma unroll
  for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
    for (int np = 0; np < 4; np++) {
      u32 bb[4];
      ldsm_x4(bb, sK + swz(np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
      mma16816<BF16>(s[2 * np], qf[kk], bb[0], bb[1]);
      mma16816<BF16>(s[2 * np + 1], qf[kk], bb[2], bb[3]);
    }
  }
  __syncthreads();  // the K tile may be overwritten by the next call
}

// Pass 1: per (head, proxy row, part): m (max of scaled log2 scores), l = Σ 2^(s−m),
// t = Σ 2^(s−m)·s. Written to part-major arrays [H][b][nParts].
template <int D, int NW, bool BF16>
__device__ __forceinline__ void proxy_pass1_body(const u16* q, const u16* k, float* pm, float* pl, float* pt, int n,
                                                 int H, int Hkv, int b, float scaleLog2) {
  constexpr int ROWB = D * 2, BM = NW * 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 sQ = smem_addr(smem), sK = sQ + BM * ROWB;
  const int part = blockIdx.x, h = blockIdx.y, nParts = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  const int posA = n - b + rA, posB = n - b + rB;
  float mA = CRISP_NEG_INF, mB = CRISP_NEG_INF, lA = 0.f, lB = 0.f, tA = 0.f, tB = 0.f;
  u32 qf[D / 16][4];
  for (int tt = 0; tt < PART_TILES; tt++) {
    const int ks = part * PART_KEYS + tt * 64;
    if (ks >= n) break;
    float s[8][4];
    proxy_scores<D, NW, BF16>(q, k, n, H, Hkv, b, h, sQ, sK, ks, s, qf, tt == 0);
    float mxA = CRISP_NEG_INF, mxB = CRISP_NEG_INF;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = ks + j * 8 + (lane & 3) * 2 + e;
        float x = s[j][e] * scaleLog2, y = s[j][2 + e] * scaleLog2;
        if (col > posA || rA >= b) x = CRISP_NEG_INF;
        if (col > posB || rB >= b) y = CRISP_NEG_INF;
        s[j][e] = x;
        s[j][2 + e] = y;
        mxA = fmaxf(mxA, x);
        mxB = fmaxf(mxB, y);
      }
    }
    mxA = quad_max(mxA);
    mxB = quad_max(mxB);
    const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
    const float uA = nA == CRISP_NEG_INF ? 0.f : nA, uB = nB == CRISP_NEG_INF ? 0.f : nB;
    const float cA = exp2f(mA - uA), cB = exp2f(mB - uB);
    lA *= cA;
    tA *= cA;
    lB *= cB;
    tB *= cB;
    mA = nA;
    mB = nB;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float x = s[j][e], y = s[j][2 + e];
        if (x != CRISP_NEG_INF) {
          const float p = exp2f(x - uA);
          lA += p;
          tA += p * x;
        }
        if (y != CRISP_NEG_INF) {
          const float p = exp2f(y - uB);
          lB += p;
          tB += p * y;
        }
      }
    }
  }
  lA = quad_sum(lA);
  lB = quad_sum(lB);
  tA = quad_sum(tA);
  tB = quad_sum(tB);
  if ((lane & 3) == 0) {
    if (rA < b) {
      const size_t i = ((size_t)h * b + rA) * nParts + part;
      pm[i] = mA;
      pl[i] = lA;
      pt[i] = tA;
    }
    if (rB < b) {
      const size_t i = ((size_t)h * b + rB) * nParts + part;
      pm[i] = mB;
      pl[i] = lB;
      pt[i] = tB;
    }
  }
}

// Merge the parts of each proxy row: rowLse2 = m + log2 l (log2 units) and the row's
// Shannon entropy in nats, ln2 · (m + log2 l − t / l). One thread per (head, row).
extern "C" __global__ void proxy_combine(const float* pm, const float* pl, const float* pt, float* rowLse2,
                                        float* rowEntropy, int H, int b, int nParts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= H * b) return;
  const float* m = pm + (size_t)i * nParts;
  float M = CRISP_NEG_INF;
  for (int p = 0; p < nParts; p++) M = fmaxf(M, m[p]);
  float L = 0.f, T = 0.f;
  for (int p = 0; p < nParts; p++) {
    if (m[p] == CRISP_NEG_INF) continue;
    const float c = exp2f(m[p] - M);
    L += pl[(size_t)i * nParts + p] * c;
    T += pt[(size_t)i * nParts + p] * c;
  }
  const float lse2 = M + log2f(L);
  rowLse2[i] = lse2;
  rowEntropy[i] = 0.6931471805599453f * (lse2 - T / L);
}

// Pass 2: normalised probabilities of each 64-key tile go to shared memory; one thread
// per key sums its column (a_v), one thread per diagonal sums along it into the part's
// slash accumulator (a_s partials, later gathered by proxy_slash_gather).
template <int D, int NW, bool BF16>
__device__ __forceinline__ void proxy_pass2_body(const u16* q, const u16* k, const float* rowLse2, float* av,
                                                 float* slashPart, int n, int H, int Hkv, int b,
                                                 float scaleLog2) {
  constexpr int ROWB = D * 2, BM = NW * 16, NT = NW * 32;
  constexpr int PS = 65;  // padded stride of the probability tile
  constexpr int SP = PART_KEYS + BM;  // slash partial length per part
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 sQ = smem_addr(smem), sK = sQ + BM * ROWB;
  float* P = reinterpret_cast<float*>(smem + BM * ROWB + 64 * ROWB);
  float* acc = P + BM * PS;
  const int part = blockIdx.x, h = blockIdx.y, nParts = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  const int posA = n - b + rA, posB = n - b + rB;
  const float lseA = rA < b ? rowLse2[h * b + rA] : 0.f, lseB = rB < b ? rowLse2[h * b + rB] : 0.f;
  const float invB = 1.f / (float)b;
  for (int i = tid; i < SP; i += NT) acc[i] = 0.f;
  const int ps = part * PART_KEYS;
  const int oMin = n - b - ps - (PART_KEYS - 1);  // offset stored at acc[0]
  u32 qf[D / 16][4];
  for (int tt = 0; tt < PART_TILES; tt++) {
    const int ks = ps + tt * 64;
    if (ks >= n) break;
    float s[8][4];
    proxy_scores<D, NW, BF16>(q, k, n, H, Hkv, b, h, sQ, sK, ks, s, qf, tt == 0);
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int c = j * 8 + (lane & 3) * 2 + e, col = ks + c;
        const float x = (col > posA || rA >= b) ? 0.f : exp2f(s[j][e] * scaleLog2 - lseA);
        const float y = (col > posB || rB >= b) ? 0.f : exp2f(s[j][2 + e] * scaleLog2 - lseB);
        P[rA * PS + c] = x;
        P[rB * PS + c] = y;
      }
    }
    __syncthreads();
    if (tid < 64 && ks + tid < n) {
      float sum = 0.f;
      for (int r = 0; r < b; r++) sum += P[r * PS + tid];
      av[(size_t)h * n + ks + tid] = sum * invB;
    }
    // diagonal u = r − c + 63 (0 .. b + 62) holds offset o = n − b − ks − 63 + u
    for (int u = tid; u < b + 63; u += NT) {
      float sum = 0.f;
      const int rLo = u - 63 > 0 ? u - 63 : 0, rHi = u < b - 1 ? u : b - 1;
      for (int r = rLo; r <= rHi; r++) sum += P[r * PS + (r - u + 63)];
      const int o = n - b - ks - 63 + u;
      acc[o - oMin] += sum;
    }
    __syncthreads();
  }
  for (int i = tid; i < SP; i += NT) slashPart[((size_t)h * nParts + part) * SP + i] = acc[i] * invB;
}

// a_s[h][o] = Σ over the (at most two) parts whose offset range holds o, in part order.
extern "C" __global__ void proxy_slash_gather(const float* slashPart, float* as, int n, int H, int b, int BM,
                                             int nParts) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)H * n) return;
  const int h = (int)(i / n), o = (int)(i % n);
  const int SP = PART_KEYS + BM;
  // part p covers offsets [n − b − 512p − 511, n − 1 − 512p]
  int pHi = (n - 1 - o) / PART_KEYS;
  if (pHi > nParts - 1) pHi = nParts - 1;
  const int lo = n - b - (PART_KEYS - 1) - o;  // need 512p >= lo
  int pLo = lo <= 0 ? 0 : (lo + PART_KEYS - 1) / PART_KEYS;
  float sum = 0.f;
  for (int p = pLo; p <= pHi; p++) {
    const int oMin = n - b - p * PART_KEYS - (PART_KEYS - 1);
    sum += slashPart[((size_t)h * nParts + p) * SP + (o - oMin)];
  }
  as[i] = sum;
}

// Block sums: out[h][J] = Σ_{t in block J} x[h][t] (fixed tree order). Grid (Nb, H), 128 threads.
extern "C" __global__ void block_sums(const float* x, float* out, int n, int B) {
  __shared__ float red[128];
  const int J = blockIdx.x, h = blockIdx.y, Nb = gridDim.x;
  float s = 0.f;
  for (int t = threadIdx.x; t < B; t += 128) {
    const int j = J * B + t;
    if (j < n) s += x[(size_t)h * n + j];
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = 64; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[(size_t)h * Nb + J] = red[0];
}

// C_struct per head: the mass of a_v over the sink (j < wSink) and the local window
// (j >= n − wLocal), each key counted once where the two overlap (short n), as the
// reference does: the mean over proxy rows of the anchored mass. Grid H, 256 threads.
extern "C" __global__ void anchor_mass(const float* av, float* cStruct, int n, int wSink, int wLocal) {
  __shared__ float red[256];
  const int h = blockIdx.x;
  const int s0 = wSink < n ? wSink : n, l0 = n - wLocal > 0 ? n - wLocal : 0;
  float s = 0.f;
  for (int j = threadIdx.x; j < s0; j += 256) s += av[(size_t)h * n + j];
  for (int j = (l0 > s0 ? l0 : s0) + threadIdx.x; j < n; j += 256) s += av[(size_t)h * n + j];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) cStruct[h] = red[0];
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

// FlexPrefill's pooled logits: mean(Q̂) · K̄_J · scale for every J, per head; one warp per
// (J, h). qMean [H][D], kMean [Hkv][Nb][D], out [H][Nb] (natural-log units).
extern "C" __global__ void pooled_logits(const float* qMean, const float* kMean, float* out, int H, int Hkv, int Nb,
                                        int D, float scale) {
  const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (w >= H * Nb) return;
  const int h = w / Nb, J = w % Nb, kvh = h / (H / Hkv);
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s += qMean[(size_t)h * D + d] * kMean[((size_t)kvh * Nb + J) * D + d];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) out[w] = s * scale;
}

#define CRISP_PROXY(SUF, D, NW, BF16)                                                                         \
  extern "C" __global__ void __launch_bounds__(NW * 32)                                                       \
      proxy_pass1_##SUF(const u16* q, const u16* k, float* pm, float* pl, float* pt, int n, int H, int Hkv, int b, \
                        float scaleLog2) {                                                                    \
    proxy_pass1_body<D, NW, BF16>(q, k, pm, pl, pt, n, H, Hkv, b, scaleLog2);                                 \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(NW * 32)                                                       \
      proxy_pass2_##SUF(const u16* q, const u16* k, const float* rowLse2, float* av, float* slashPart, int n,   \
                        int H, int Hkv, int b, float scaleLog2) {                                             \
    proxy_pass2_body<D, NW, BF16>(q, k, rowLse2, av, slashPart, n, H, Hkv, b, scaleLog2);                     \
  }

CRISP_PROXY(bf16_d64_b64, 64, 4, true)
CRISP_PROXY(bf16_d64_b128, 64, 8, true)
CRISP_PROXY(bf16_d128_b64, 128, 4, true)
CRISP_PROXY(bf16_d128_b128, 128, 8, true)
CRISP_PROXY(f16_d64_b64, 64, 4, false)
CRISP_PROXY(f16_d64_b128, 64, 8, false)
CRISP_PROXY(f16_d128_b64, 128, 4, false)
CRISP_PROXY(f16_d128_b128, 128, 8, false)
