// PE path: pooled block map and the γ coverage cut, on the GPU.
//
// Shape legend: Nb blocks; nh listed heads; qMean [nh][Nb][D] (Q̄_I, the listed heads
// only: at 512k Q is 4 GiB and a handful of heads go to PE), kMean [Hkv][Nb][D]
// (K̄_J), both f32 block means. P [nh][Nb][Nb] f32 holds Ā = softmax_J(Q̄_I · K̄_J · scale)
// over J <= I (entries above the diagonal are never read).
//
// The cut keeps the shortest prefix of the entries sorted descending (ties: lower
// row-major flat index first) whose cumulative sum reaches γ · Σ Ā. No sort: values are
// non-negative, so their f32 bit patterns order like the values, and a 4-pass radix
// select (8 bits a pass, count and sum per bin) finds the threshold value τ at which the
// cumulative sum crosses. Sums are 2^-48 fixed point in u64 integer atomics: exact and
// order-independent, so the cut is deterministic. Entries > τ are kept, plus the first r
// entries equal to τ in flat order, r the fewest that reach the target.
#include "crisp-common.cuh"

#define FIX_SCALE 281474976710656.0  // 2^48

__device__ __forceinline__ u64 to_fix(float v) { return __double2ull_rn((double)v * FIX_SCALE); }

// Q̄ of the listed heads: out[hi][I][d] = mean of q[r][heads[hi]][d] over the rows r of
// block I, in f32 and row order (as block_means). Grid (Nb, nh), D threads.
template <bool BF16>
__device__ __forceinline__ void pe_q_means_body(const u16* q, const int* heads, float* out, int n, int H, int D,
                                                int B) {
  const int I = blockIdx.x, hi = blockIdx.y, Nb = gridDim.x, d = threadIdx.x;
  const int h = heads[hi];
  const int r0 = I * B;
  const int r1 = r0 + B < n ? r0 + B : n;
  float s = 0.f;
  for (int r = r0; r < r1; r++) s += to_f32<BF16>(q[((size_t)r * H + h) * D + d]);
  out[((size_t)hi * Nb + I) * D + d] = s / (float)(r1 - r0);
}
extern "C" __global__ void pe_q_means_bf16(const u16* q, const int* heads, float* out, int n, int H, int D, int B) {
  pe_q_means_body<true>(q, heads, out, n, H, D, B);
}
extern "C" __global__ void pe_q_means_f16(const u16* q, const int* heads, float* out, int n, int H, int D, int B) {
  pe_q_means_body<false>(q, heads, out, n, H, D, B);
}

// 64x64 tiles of Q̄ K̄ᵀ · scale, lower-triangular tiles only. Grid (tiles, tiles, nh), 256 threads.
extern "C" __global__ void pe_logits(const float* qMean, const float* kMean, const int* heads,
                                                            float* P, int H, int Hkv, int Nb, int D, float scale) {
  const int ti = blockIdx.x, tj = blockIdx.y, hi = blockIdx.z;
  if (tj > ti) return;
  const int h = heads[hi], kvh = h / (H / Hkv);
  __shared__ float As[16][68], Bs[16][68];
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float c[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) c[i][j] = 0.f;
  const float* Qb = qMean + (size_t)hi * Nb * D;
  const float* Kb = kMean + (size_t)kvh * Nb * D;
  for (int d0 = 0; d0 < D; d0 += 16) {
    for (int e = threadIdx.x; e < 64 * 16; e += 256) {
      const int r = e >> 4, dd = e & 15;
      const int I = ti * 64 + r, J = tj * 64 + r;
      As[dd][r] = I < Nb ? Qb[(size_t)I * D + d0 + dd] : 0.f;
      Bs[dd][r] = J < Nb ? Kb[(size_t)J * D + d0 + dd] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int dd = 0; dd < 16; dd++) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = As[dd][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; j++) b[j] = Bs[dd][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) c[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int I = ti * 64 + ty * 4 + i;
    if (I >= Nb) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int J = tj * 64 + tx * 4 + j;
      if (J <= I) P[((size_t)hi * Nb + I) * Nb + J] = c[i][j] * scale;
    }
  }
}

__device__ __forceinline__ float cta_max256(float x, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}
__device__ __forceinline__ float cta_sum256(float x, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// Row softmax over J <= I, in place. Grid (Nb, nh), 256 threads.
extern "C" __global__ void __launch_bounds__(256) pe_softmax(float* P, int Nb) {
  __shared__ float red[256];
  const int I = blockIdx.x, hi = blockIdx.y;
  float* row = P + ((size_t)hi * Nb + I) * Nb;
  float m = CRISP_NEG_INF;
  for (int J = threadIdx.x; J <= I; J += 256) m = fmaxf(m, row[J]);
  m = cta_max256(m, red);
  float s = 0.f;
  for (int J = threadIdx.x; J <= I; J += 256) s += __expf(row[J] - m);
  s = cta_sum256(s, red);
  const float inv = 1.f / s;
  for (int J = threadIdx.x; J <= I; J += 256) row[J] = __expf(row[J] - m) * inv;
}

#define PE_ROWS_PER_CTA 16

// One radix pass: histogram (count, fixed-point sum) of digit `pass` of the entries whose
// higher digits equal the prefix found so far. Grid (ceil(Nb / 16), nh), 256 threads.
extern "C" __global__ void __launch_bounds__(256) pe_radix_hist(const float* P, int Nb, int pass, const u32* prefix,
                                                                u32* cnt, u64* sum) {
  __shared__ u32 hc[256];
  __shared__ u64 hs[256];
  const int hi = blockIdx.y;
  hc[threadIdx.x] = 0;
  hs[threadIdx.x] = 0;
  __syncthreads();
  const u32 pre = prefix[hi];
  const int shift = 24 - 8 * pass;
  const int I0 = blockIdx.x * PE_ROWS_PER_CTA;
  const int lane = threadIdx.x & 31;
  for (int I = I0; I < I0 + PE_ROWS_PER_CTA && I < Nb; I++) {
    const float* row = P + ((size_t)hi * Nb + I) * Nb;
    // Whole warps iterate together so the warp intrinsics see every lane.
    for (int J0 = 0; J0 <= I; J0 += 256) {
      const int J = J0 + threadIdx.x;
      const float v = J <= I ? row[J] : 0.f;
      const u32 bits = __float_as_uint(v);
      const bool valid = J <= I && (pass == 0 || (bits >> (shift + 8)) == pre);
      const u32 act = __ballot_sync(0xffffffffu, valid);
      if (!valid) continue;
      // Most entries of a pass share a few digits (pass 0: the exponent byte), so lanes
      // would queue on the same shared-memory counters: one atomic per distinct digit per
      // warp instead. The 2^-48 fixed-point value (< 2^48) is summed as two 24-bit halves,
      // exactly, in 32-bit warp reductions.
      const u32 dgt = (bits >> shift) & 255u;
      const u32 grp = __match_any_sync(act, dgt);
      const u64 fx = to_fix(v);
      const u32 sHi = __reduce_add_sync(grp, (u32)(fx >> 24));
      const u32 sLo = __reduce_add_sync(grp, (u32)(fx & 0xffffffu));
      if (lane == __ffs(grp) - 1) {
        atomicAdd(&hc[dgt], (u32)__popc(grp));
        atomicAdd(&hs[dgt], ((u64)sHi << 24) + (u64)sLo);
      }
    }
  }
  __syncthreads();
  if (hc[threadIdx.x] != 0) {
    atomicAdd(&cnt[hi * 256 + threadIdx.x], hc[threadIdx.x]);
    atomicAdd(&sum[hi * 256 + threadIdx.x], hs[threadIdx.x]);
  }
}

// state per head (u64 words): [0] prefix, [1] sumAbove, [2] countAbove, [3] target,
// [4] tauBits, [5] r (τ-equal entries to keep), [6] countEqual.
extern "C" __global__ void pe_radix_select(const u32* cnt, const u64* sum, u64* state, u32* prefix, int nh, int pass,
                                           double gamma) {
  const int hi = blockIdx.x * blockDim.x + threadIdx.x;
  if (hi >= nh) return;
  u64* st = state + hi * 8;
  const u32* c = cnt + hi * 256;
  const u64* s = sum + hi * 256;
  if (pass == 0) {
    u64 total = 0;
    for (int d = 0; d < 256; d++) total += s[d];
    const u64 t = __double2ull_ru(gamma * (double)total);
    st[0] = 0;
    st[1] = 0;
    st[2] = 0;
    st[3] = t < 1ull ? 1ull : t;
  }
  const u64 target = st[3];
  u64 above = st[1], cAbove = st[2];
  int chosen = -1;
  for (int d = 255; d >= 0; d--) {
    if (c[d] == 0) continue;
    if (above + s[d] >= target) {
      chosen = d;
      break;
    }
    above += s[d];
    cAbove += c[d];
  }
  if (chosen < 0) {  // rounding left the target unreached: take everything down to the lowest bin
    for (int d = 0; d < 256; d++)
      if (c[d] != 0) {
        chosen = d;
        above -= s[d];
        cAbove -= c[d];
        break;
      }
    if (chosen < 0) chosen = 0;
  }
  st[1] = above;
  st[2] = cAbove;
  const u32 pre = (u32)((st[0] << 8) | (u32)chosen);
  st[0] = pre;
  prefix[hi] = pre;
  if (pass == 3) {
    const float tau = __uint_as_float(pre);
    const u64 tf = to_fix(tau);
    const u64 eq = c[chosen];
    u64 r = eq;
    if (tf > 0 && target > above) r = (target - above + tf - 1) / tf;
    if (r < 1) r = 1;
    if (r > eq) r = eq;
    st[4] = pre;
    st[5] = r;
    st[6] = eq;
  }
}

// Per row: entries > τ and entries == τ. Grid (Nb, nh), 256 threads.
extern "C" __global__ void __launch_bounds__(256) pe_row_counts(const float* P, int Nb, const u64* state, int* strictCnt,
                                                                int* eqCnt) {
  __shared__ int red[2][256];
  const int I = blockIdx.x, hi = blockIdx.y;
  const u32 tau = (u32)state[hi * 8 + 4];
  const float* row = P + ((size_t)hi * Nb + I) * Nb;
  int gt = 0, eq = 0;
  for (int J = threadIdx.x; J <= I; J += 256) {
    const u32 bits = __float_as_uint(row[J]);
    gt += bits > tau;
    eq += bits == tau;
  }
  red[0][threadIdx.x] = gt;
  red[1][threadIdx.x] = eq;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      red[0][threadIdx.x] += red[0][threadIdx.x + w];
      red[1][threadIdx.x] += red[1][threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    strictCnt[hi * Nb + I] = red[0][0];
    eqCnt[hi * Nb + I] = red[1][0];
  }
}

// Per head: eqStart = exclusive scan of eqCnt over rows; kept count per row =
// strict + clamp(r − eqStart, 0, eq). Grid nh, 1024 threads.
extern "C" __global__ void __launch_bounds__(1024) pe_row_kept(const int* strictCnt, const int* eqCnt, int* eqStart,
                                                               int* kept, const u64* state, int Nb) {
  const int hi = blockIdx.x;
  cta_exclusive_scan(eqCnt + hi * Nb, eqStart + hi * (Nb + 1), Nb);
  __syncthreads();
  const long long r = (long long)state[hi * 8 + 5];
  for (int I = threadIdx.x; I < Nb; I += 1024) {
    const long long st = eqStart[hi * (Nb + 1) + I], e = eqCnt[hi * Nb + I];
    long long take = r - st;
    if (take < 0) take = 0;
    if (take > e) take = e;
    kept[hi * Nb + I] = strictCnt[hi * Nb + I] + (int)take;
  }
}

// Write each row's kept key blocks in ascending J. One warp per row; grid (Nb, nh).
extern "C" __global__ void pe_write(const float* P, int Nb, const u64* state, const int* eqStart, const int* rowPtr,
                                   int* cols) {
  const int I = blockIdx.x, hi = blockIdx.y, lane = threadIdx.x;
  const u32 tau = (u32)state[hi * 8 + 4];
  const long long r = (long long)state[hi * 8 + 5];
  const float* row = P + ((size_t)hi * Nb + I) * Nb;
  long long eqRank = eqStart[hi * (Nb + 1) + I];
  int pos = rowPtr[hi * Nb + I];
  for (int J0 = 0; J0 <= I; J0 += 32) {
    const int J = J0 + lane;
    const u32 bits = J <= I ? __float_as_uint(row[J]) : 0u;
    const bool isEq = J <= I && bits == tau;
    const u32 eqMask = __ballot_sync(0xffffffffu, isEq);
    const long long myRank = eqRank + __popc(eqMask & ((1u << lane) - 1u));
    const bool keep = J <= I && (bits > tau || (isEq && myRank < r));
    const u32 keepMask = __ballot_sync(0xffffffffu, keep);
    if (keep) cols[pos + __popc(keepMask & ((1u << lane) - 1u))] = J;
    pos += __popc(keepMask);
    eqRank += __popc(eqMask);
  }
}
