// PE path: pooled block map and the γ coverage cut, on the GPU.
//
// Shape legend: Nb blocks; nh listed heads; qMean [nh][Nb][D] (Q̄_I, the listed heads
// only: at 512k Q is 4 GiB and a handful of heads go to PE), kMean [Hkv][Nb][D]
// (K̄_J), both f32 block means. P [nh][Nb][Nb] f32 holds Ā = softmax_J(Q̄_I · K̄_J · scale)
// over J <= I (entries above the diagonal are never read).
//
// The head list hl = [nh][heads ascending] is device memory: the host uploads it, or the
// device router writes it (route.cu) and the host never learns nh before the kernels run.
// So the buffers have a slot per possible head (hi = the head-slot index), the per-row
// kernels' grids a few slots (gridDim.y or .z) that loop over hi < nh, and the slots past nh
// do nothing (pe_row_kept writes their rows as empty). A grid of every slot would launch ~30k
// CTAs that leave at once (for 3 PE heads of 32 at 128k): ~17 us a kernel on the H200.
//
// The cut keeps the shortest prefix of the entries sorted descending (ties: lower
// row-major flat index first) whose cumulative sum reaches γ · Σ Ā. No sort: values are
// non-negative, so their f32 bit patterns order like the values, and a 4-pass radix
// select (8 bits a pass, count and sum per bin) finds the threshold value τ at which the
// cumulative sum crosses. Sums are 2^-48 fixed point in u64 integer atomics: exact and
// order-independent, so the cut is deterministic. Entries > τ are kept, plus the first r
// entries equal to τ in flat order, r the fewest that reach the target.
#include "../common/crisp-common.cuh"

#define FIX_SCALE 281474976710656.0  // 2^48

__device__ __forceinline__ u64 to_fix(float v) { return __double2ull_rn((double)v * FIX_SCALE); }

// Q̄ of the listed heads: out[hi][I][d] = mean of q[r][heads[hi]][d] over the rows r of
// block I, in f32. q holds positions qOff .. n − 1 (qOff > 0: chunked prefill over a cached
// prefix): block I's rows are the positions max(I·B, qOff) .. min(I·B + B, n) − 1, q's rows
// those minus qOff (a partial first block over its real rows); a block with none gets 0.
// Grid (Nb, a few slots), PE_QM_THREADS threads: thread t reads the 16-byte
// chunk t % (D / 8) (8 columns) of rows r0 + t / (D / 8) + k·RG (RG = PE_QM_THREADS / (D / 8)
// row groups), then the groups' partial sums are added in group order, so the result is
// reproducible. (One thread a column with 2-byte loads was 43 us at 128k for 3 heads on the
// H200: the head's 256-byte row slice is 8 KiB from the next row's.)
#define PE_QM_THREADS 128
template <bool BF16>
__device__ __forceinline__ void pe_q_means_body(const u16* q, const int* hl, float* out, int n, int H, int D,
                                                int B, int qOff) {
  __shared__ float part[PE_QM_THREADS * 8];
  const int I = blockIdx.x, Nb = gridDim.x, t = threadIdx.x, nh = hl[0];
  const int CH = D / 8, RG = PE_QM_THREADS / CH, ch = t % CH, rg = t / CH;
  for (int hi = blockIdx.y; hi < nh; hi += gridDim.y) {
    const int h = hl[1 + hi];
    const int r0 = I * B > qOff ? I * B : qOff;
    const int r1 = I * B + B < n ? I * B + B : n;
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; e++) s[e] = 0.f;
    for (int r = r0 + rg; r < r1; r += RG) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(q + ((size_t)(r - qOff) * H + h) * D) + ch);
      const u32 w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        s[2 * e] += to_f32<BF16>((u16)(w[e] & 0xffffu));
        s[2 * e + 1] += to_f32<BF16>((u16)(w[e] >> 16));
      }
    }
    // part[rg][d] for d = ch·8 + e
#pragma unroll
    for (int e = 0; e < 8; e++) part[rg * D + ch * 8 + e] = s[e];
    __syncthreads();
    for (int d = t; d < D; d += PE_QM_THREADS) {
      float tot = 0.f;
      for (int g = 0; g < RG; g++) tot += part[g * D + d];
      out[((size_t)hi * Nb + I) * D + d] = r1 > r0 ? tot / (float)(r1 - r0) : 0.f;
    }
    __syncthreads();  // part is reused by the next slot
  }
}
extern "C" __global__ void pe_q_means_bf16(const u16* q, const int* hl, float* out, int n, int H, int D, int B,
                                           int qOff) {
  pe_q_means_body<true>(q, hl, out, n, H, D, B, qOff);
}
extern "C" __global__ void pe_q_means_f16(const u16* q, const int* hl, float* out, int n, int H, int D, int B,
                                          int qOff) {
  pe_q_means_body<false>(q, hl, out, n, H, D, B, qOff);
}

// One 64x64 tile of head slot hi's Q̄ K̄ᵀ · scale (kv head kvh). Both 64 x D operands are
// staged whole, transposed (As[d][r], rows padded to 68 floats so a thread's four rows are one
// 16-byte load), in one round of loads (a thread's 16-byte reads all in flight) and one
// barrier; then each thread forms a 4x4 block of the tile. (Staging 16 columns at a time, a
// load round and two barriers each, was 42 us at 128k for 3 PE heads on the H200: the
// loads' latency eight times over.) The stores into As[d][r] take r
// from consecutive lanes: no bank conflicts.
#define PE_LG_PAD 68
__device__ __forceinline__ void pe_logits_tile(const float* qMean, const float* kMean, float* P, int kvh, int hi, int ti,
                                               int tj, int Nb, int D, float scale, float* As, float* Bs) {
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const float* Qb = qMean + (size_t)hi * Nb * D;
  const float* Kb = kMean + (size_t)kvh * Nb * D;
  const int D4 = D >> 2;
  for (int e = threadIdx.x; e < 64 * D4; e += 256) {
    const int r = e & 63, c = (e >> 6) << 2;
    const int I = ti * 64 + r, J = tj * 64 + r;
    const float4 a = I < Nb ? *reinterpret_cast<const float4*>(Qb + (size_t)I * D + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 b = J < Nb ? *reinterpret_cast<const float4*>(Kb + (size_t)J * D + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    As[(c + 0) * PE_LG_PAD + r] = a.x;
    As[(c + 1) * PE_LG_PAD + r] = a.y;
    As[(c + 2) * PE_LG_PAD + r] = a.z;
    As[(c + 3) * PE_LG_PAD + r] = a.w;
    Bs[(c + 0) * PE_LG_PAD + r] = b.x;
    Bs[(c + 1) * PE_LG_PAD + r] = b.y;
    Bs[(c + 2) * PE_LG_PAD + r] = b.z;
    Bs[(c + 3) * PE_LG_PAD + r] = b.w;
  }
  __syncthreads();
  float c[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) c[i][j] = 0.f;
#pragma unroll 8
  for (int d = 0; d < D; d++) {
    const float4 a = *reinterpret_cast<const float4*>(As + d * PE_LG_PAD + ty * 4);
    const float4 b = *reinterpret_cast<const float4*>(Bs + d * PE_LG_PAD + tx * 4);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) c[i][j] = fmaf(av[i], bv[j], c[i][j]);
  }
  __syncthreads();  // As and Bs are reused by the next slot
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

// 64x64 tiles of Q̄ K̄ᵀ · scale, lower-triangular tiles only. Grid (tiles, tiles, a few
// slots), 256 threads, 2 · D · PE_LG_PAD floats of dynamic shared memory (D a multiple of 4).
extern "C" __global__ void __launch_bounds__(256) pe_logits(const float* qMean, const float* kMean, const int* hl,
                                                            float* P, int H, int Hkv, int Nb, int D, float scale) {
  extern __shared__ float4 pe_lg_smem[];
  float* As = reinterpret_cast<float*>(pe_lg_smem);
  float* Bs = As + D * PE_LG_PAD;
  const int ti = blockIdx.x, tj = blockIdx.y, nh = hl[0];
  if (tj > ti) return;
  for (int hi = blockIdx.z; hi < nh; hi += gridDim.z) {
    pe_logits_tile(qMean, kMean, P, hl[1 + hi] / (H / Hkv), hi, ti, tj, Nb, D, scale, As, Bs);
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

__device__ __forceinline__ void pe_softmax_row(float* row, int I, float* red) {
  float m = CRISP_NEG_INF;
  for (int J = threadIdx.x; J <= I; J += 256) m = fmaxf(m, row[J]);
  m = cta_max256(m, red);
  float s = 0.f;
  for (int J = threadIdx.x; J <= I; J += 256) s += __expf(row[J] - m);
  s = cta_sum256(s, red);
  const float inv = 1.f / s;
  for (int J = threadIdx.x; J <= I; J += 256) row[J] = __expf(row[J] - m) * inv;
}

// Row softmax over J <= I, in place. Grid (Nb, a few slots), 256 threads. CTA (0, 0) also
// zeroes z0[0 .. n0) and z1[0 .. n1) (the radix passes' counters and sums, which the first
// pass needs at zero: no memsets from the host). Rows I < I0 (query blocks before a chunk's
// first query row: no query rows) are zeroed: they take no mass and keep no entry.
extern "C" __global__ void __launch_bounds__(256) pe_softmax(float* P, int Nb, const int* hl, unsigned* z0, int n0,
                                                             unsigned* z1, int n1, int I0) {
  __shared__ float red[256];
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int i = threadIdx.x; i < n0; i += 256) z0[i] = 0u;
    for (int i = threadIdx.x; i < n1; i += 256) z1[i] = 0u;
  }
  const int I = blockIdx.x, nh = hl[0];
  for (int hi = blockIdx.y; hi < nh; hi += gridDim.y) {
    float* row = P + ((size_t)hi * Nb + I) * Nb;
    if (I >= I0) pe_softmax_row(row, I, red);
    else
      for (int J = threadIdx.x; J <= I; J += 256) row[J] = 0.f;
  }
}

#define PE_HIST_THREADS 512
#define PE_HIST_SMEM (3 * 256 * 32 * 4)  // dynamic shared memory: three [256][32] u32 tables, 96 KiB

// One entry into the lane's copy of the histogram: count, and the 2^-48 fixed-point value
// (< 2^49) added to a (hi, lo) pair of u32 words. Shared 64-bit atomicAdd is a CAS loop
// on sm_80/sm_90 (it retries when another warp writes the word in between), 32-bit add is
// native: the lo add returns the old word, and its carry-out goes to hi with the high
// half, so hi · 2^32 + lo is the exact u64 sum in any order.
__device__ __forceinline__ void pe_hist_add(float v, int pass, u32 pre, int shift, int lane, u32* hc, u32* hl,
                                            u32* hh) {
  const u32 bits = __float_as_uint(v);
  if (pass != 0 && (bits >> (shift + 8)) != pre) return;
  const u32 slot = (((bits >> shift) & 255u) << 5) | (u32)lane;
  const u64 fx = to_fix(v);
  const u32 lo = (u32)fx;
  atomicAdd(&hc[slot], 1u);
  const u32 old = atomicAdd(&hl[slot], lo);
  atomicAdd(&hh[slot], (u32)(fx >> 32) + (old + lo < old ? 1u : 0u));
}

template <int V>
struct PeVec;
template <>
struct PeVec<4> {
  typedef float4 T;
  static __device__ __forceinline__ float at(const T& x, int c) {
    return c == 0 ? x.x : c == 1 ? x.y : c == 2 ? x.z : x.w;
  }
};
template <>
struct PeVec<2> {
  typedef float2 T;
  static __device__ __forceinline__ float at(const T& x, int c) { return c == 0 ? x.x : x.y; }
};
template <>
struct PeVec<1> {
  typedef float T;
  static __device__ __forceinline__ float at(const T& x, int) { return x; }
};

// The head's causal triangle as one flat sequence of V-float loads ("quads"): rows I and
// Nb − 1 − I are paired, row I's ceil((I + 1) / V) quads then row Nb − 1 − I's, which is
// Nb / V + 1 quads for every pair when V divides Nb (an odd Nb, V = 1, pairs its middle row
// with itself: the second half of that pair is skipped). Each warp of the grid takes an
// equal contiguous range; lane l loads quads g0 + l + 32u, u < U, all U before using any
// (16 floats, 64 bytes a lane in flight). A quad never reads past its row: V·q <= I and V
// divides Nb. Entries past the diagonal in a row's last quad are loaded but not counted.
template <int V>
__device__ __forceinline__ void pe_radix_hist_body(const float* P, int Nb, int pass, u32 pre, u32* hc, u32* hl,
                                                   u32* hh, int nct) {
  typedef typename PeVec<V>::T T;
  constexpr int U = 16 / V;
  const int lane = threadIdx.x & 31, hi = blockIdx.y, shift = 24 - 8 * pass;
  const int L = Nb / V + 1, np = (Nb + 1) >> 1;
  const long long total = (long long)np * L, W = (long long)nct * (PE_HIST_THREADS / 32);
  const long long w = (long long)blockIdx.x * (PE_HIST_THREADS / 32) + (threadIdx.x >> 5);
  int g0 = (int)(w * total / W);
  const int g1 = (int)((w + 1) * total / W);
  const float* base = P + (size_t)hi * Nb * Nb;
  // this lane's next quad: pair p, position o in the pair's sequence
  int p = (g0 + lane) / L, o = (g0 + lane) - p * L;
  for (; g0 < g1; g0 += 32 * U) {  // warp-uniform
    T x[U];
    int nv[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      nv[u] = 0;
      if (g0 + lane + 32 * u < g1) {
        const int qa = (p + V) / V;  // quads of row p
        const bool first = o < qa;
        const int I = first ? p : Nb - 1 - p, q = first ? o : o - qa;
        if (first || I != p) {
          const int left = I + 1 - V * q;
          nv[u] = left < V ? left : V;
          x[u] = __ldg(reinterpret_cast<const T*>(base + (size_t)I * Nb + V * q));
        }
      }
      o += 32;
      if (o >= L) {
        const int k = o / L;
        p += k;
        o -= k * L;
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int c = 0; c < V; c++)
        if (c < nv[u]) pe_hist_add(PeVec<V>::at(x[u], c), pass, pre, shift, lane, hc, hl, hh);
  }
}

// One radix pass: histogram (count, fixed-point sum) of digit `pass` of the entries whose
// higher digits equal the prefix found so far, then, in the head's last CTA to finish, the
// digit where the running sum from the top reaches the target (pe_radix_choose). Grid (X,
// slots), 512 threads, PE_HIST_SMEM bytes of dynamic shared memory; nct = max(1, min(X,
// budget / nh)) CTAs split each head's triangle evenly (the budget is two CTAs an SM, so
// the heads together fill the SMs once, whatever nh the device router chose); the rest
// leave at once. The histogram is kept in 32
// copies, one per lane index (slot digit · 32 + lane: a warp's 32 atomics fall in 32 banks
// and never on one word, even when the whole warp has the same digit, as pass 0's exponent
// digits mostly do); the warps of the CTA share them. At the end each digit's 32 copies are
// summed (integers, any order) and added to cnt and sum. Replaces a loop of one entry a
// thread per step with __match_any_sync, two __reduce_add_sync and per-row 16-row CTAs
// (1.12 ms for 4 passes at 512k, 3 heads, on the H200: latency bound, one 4-byte load a
// thread in flight, and unbalanced rows). Same counts and sums bit for bit: each entry adds
// to_fix(v) exactly.
//
// The choice was a kernel of its own (pe_radix_select: one thread a head walking the 256
// digits through global memory, ~31 us a pass on the H200, latency bound) and each pass
// needed two memsets first. Now the last CTA of a head (a ticket counter, done[head])
// chooses with 256 threads and a suffix scan, then zeroes the head's cnt, sum and ticket for
// the next pass: the host zeroes them once, before pass 0.
//
// state per head (u64 words): [0] prefix, [1] sumAbove, [2] countAbove, [3] target,
// [4] tauBits, [5] r (τ-equal entries to keep), [6] countEqual.
__device__ __forceinline__ void pe_radix_choose(u32* cnt, u64* sum, u64* state, u32* prefix, int hi, int pass,
                                                double gamma, unsigned char* smem, int& lowest) {
  // reuses the histogram's shared memory (every thread is past it): suffix sums S[d] =
  // Σ_{d' >= d} sum, C[d] likewise for counts, S[256] = C[256] = 0
  u64* S = reinterpret_cast<u64*>(smem);
  u32* C = reinterpret_cast<u32*>(smem + 2 * 257 * 8);
  const int d = threadIdx.x;
  u32* c = cnt + hi * 256;
  u64* s = sum + hi * 256;
  u64* st = state + hi * 8;
  if (d < 256) {
    const u32 cd = __ldcg(c + d);
    S[d] = __ldcg(s + d);
    C[d] = cd;
    if (cd != 0) atomicMin(&lowest, d);
  } else if (d == 256) {
    S[256] = 0;
    C[256] = 0;
  }
  __syncthreads();
  // inclusive suffix scan, Hillis-Steele over 256 entries (integers: exact in any order)
  for (int off = 1; off < 256; off <<= 1) {
    u64 sv = 0;
    u32 cv = 0;
    if (d < 256 && d + off < 256) {
      sv = S[d + off];
      cv = C[d + off];
    }
    __syncthreads();
    if (d < 256) {
      S[d] += sv;
      C[d] += cv;
    }
    __syncthreads();
  }
  u64 target, above0, cAbove0, pre0;
  if (pass == 0) {
    const u64 t = __double2ull_ru(gamma * (double)S[0]);
    target = t < 1ull ? 1ull : t;
    above0 = 0;
    cAbove0 = 0;
    pre0 = 0;
  } else {
    pre0 = st[0];
    above0 = st[1];
    cAbove0 = st[2];
    target = st[3];
  }
  // P(d): above0 + S[d] >= target holds for d <= d* (S falls with d); d* has a non-empty bin
  // (an empty one would give P(d* + 1) too), so it is the first non-empty digit from the top
  // whose sum reaches the target, as the one-thread walk chose. None: rounding left the
  // target unreached, and everything down to the lowest non-empty digit is taken.
  const int npass = __syncthreads_count(d < 256 && above0 + S[d] >= target);
  if (d == 0) {
    int chosen = npass > 0 ? npass - 1 : (lowest < 256 ? lowest : 0);
    const u64 above = above0 + S[chosen + 1];
    const u64 cAbove = cAbove0 + C[chosen + 1];
    const u32 pre = (u32)((pre0 << 8) | (u32)chosen);
    st[0] = pre;
    st[1] = above;
    st[2] = cAbove;
    st[3] = target;
    prefix[hi] = pre;
    if (pass == 3) {
      const float tau = __uint_as_float(pre);
      const u64 tf = to_fix(tau);
      const u64 eq = C[chosen] - C[chosen + 1];
      u64 r = eq;
      if (tf > 0 && target > above) r = (target - above + tf - 1) / tf;
      if (r < 1) r = 1;
      if (r > eq) r = eq;
      st[4] = pre;
      st[5] = r;
      st[6] = eq;
    }
  }
  // the next pass starts from zero
  if (d < 256) {
    c[d] = 0;
    s[d] = 0;
  }
}

extern "C" __global__ void __launch_bounds__(PE_HIST_THREADS, 2)
    pe_radix_pass(const float* P, int Nb, int pass, u32* prefix, u32* cnt, u64* sum, u64* state, u32* done,
                  double gamma, const int* headList, int budget) {
  extern __shared__ uint4 pe_hist_smem[];
  __shared__ bool last;
  __shared__ int lowest;  // pe_radix_choose's lowest non-empty digit
  const int nh = headList[0];
  if ((int)blockIdx.y >= nh) return;
  int nct = budget / nh;
  nct = nct < (int)gridDim.x ? nct : (int)gridDim.x;
  nct = nct > 1 ? nct : 1;
  if ((int)blockIdx.x >= nct) return;
  u32* hc = reinterpret_cast<u32*>(pe_hist_smem);
  u32* hl = hc + 256 * 32;
  u32* hh = hl + 256 * 32;
  for (int i = threadIdx.x; i < PE_HIST_SMEM / 16; i += PE_HIST_THREADS) pe_hist_smem[i] = make_uint4(0u, 0u, 0u, 0u);
  if (threadIdx.x == 0) lowest = 256;
  __syncthreads();
  const int hi = blockIdx.y;
  const u32 pre = prefix[hi];
  if ((Nb & 3) == 0) pe_radix_hist_body<4>(P, Nb, pass, pre, hc, hl, hh, nct);
  else if ((Nb & 1) == 0) pe_radix_hist_body<2>(P, Nb, pass, pre, hc, hl, hh, nct);
  else pe_radix_hist_body<1>(P, Nb, pass, pre, hc, hl, hh, nct);
  __syncthreads();
  for (int d = threadIdx.x; d < 256; d += PE_HIST_THREADS) {
    u32 c = 0;
    u64 s = 0;
    for (int k = 0; k < 32; k++) {
      const int slot = (d << 5) | ((k + d) & 31);  // rotated: the warp's 32 reads in 32 banks
      c += hc[slot];
      s += ((u64)hh[slot] << 32) + hl[slot];
    }
    if (c != 0) {
      atomicAdd(&cnt[hi * 256 + d], c);
      atomicAdd(&sum[hi * 256 + d], s);
    }
  }
  // this CTA's adds are visible device-wide before its ticket is taken
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&done[hi], 1u) == (u32)nct - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  pe_radix_choose(cnt, sum, state, prefix, hi, pass, gamma, reinterpret_cast<unsigned char*>(pe_hist_smem), lowest);
  if (threadIdx.x == 0) done[hi] = 0;
}

// Per row: entries > τ and entries == τ; none in rows I < I0 (no query rows). Grid (Nb, a
// few slots), 256 threads.
extern "C" __global__ void __launch_bounds__(256) pe_row_counts(const float* P, int Nb, const u64* state, int* strictCnt,
                                                                int* eqCnt, const int* hl, int I0) {
  __shared__ int red[2][256];
  const int I = blockIdx.x, nh = hl[0];
  for (int hi = blockIdx.y; hi < nh; hi += gridDim.y) {
    const u32 tau = (u32)state[hi * 8 + 4];
    const float* row = P + ((size_t)hi * Nb + I) * Nb;
    int gt = 0, eq = 0;
    for (int J = threadIdx.x; I >= I0 && J <= I; J += 256) {
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
    __syncthreads();  // red is reused by the next slot
  }
}

// Per head: eqStart = exclusive scan of eqCnt over rows; kept count per row =
// strict + clamp(r − eqStart, 0, eq). Grid slots, 1024 threads; an unused slot's rows are
// empty (kept 0), so the scan over all slots gives them no entries.
extern "C" __global__ void __launch_bounds__(1024) pe_row_kept(const int* strictCnt, const int* eqCnt, int* eqStart,
                                                               int* kept, const u64* state, int Nb, const int* hl) {
  const int hi = blockIdx.x;
  if (hi >= hl[0]) {
    for (int I = threadIdx.x; I < Nb; I += 1024) kept[hi * Nb + I] = 0;
    return;
  }
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

// Write each row's kept key blocks in ascending J (rows I < I0 keep none). One warp per row;
// grid (Nb, a few slots).
extern "C" __global__ void pe_write(const float* P, int Nb, const u64* state, const int* eqStart, const int* rowPtr,
                                   int* cols, const int* hl, int I0) {
  const int I = blockIdx.x, lane = threadIdx.x, nh = hl[0];
  if (I < I0) return;
  for (int hi = blockIdx.y; hi < nh; hi += gridDim.y) {
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
}
