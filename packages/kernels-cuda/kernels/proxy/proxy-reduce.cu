// The small kernels around the proxy passes (proxy.cu's mma.sync and proxy-wgmma.cu's wgmma
// layouts both end here): proxy_combine merges each proxy row's parts into its log-sum-exp
// and entropy; proxy_fused_sums and proxy_cstruct reduce the fused pass's bins to block
// scores and C_struct's window mass; proxy_blocks and proxy_blocks_b reduce token scores or
// pass 2b's partials to the per-block statistics, and proxy_heads to the per-head ones, in f64
// straight into the one buffer the host downloads; count_nonfinite_f64 checks that buffer;
// block_means gives FlexPrefill's pooled keys and the PE rows' block means. Every reduction
// runs in a fixed order (no float atomics), so the statistics are bit-for-bit reproducible.
#include "../common/crisp-common.cuh"
#include "proxy-common.cuh"

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
