// VS index selection on the device, for selectors with an exact device form (the noise floor,
// core's DeviceSelectorRule): the plan's block scores p_v / p_s stay where proxy_blocks wrote
// them, and the host reads back only the selected lists. The rules and the tie order are
// @crisp/select's, in the same f64 arithmetic, so the lists are the host selector's:
//   VS heads:  μ = max(1 − p[0] − p[Nb−1], 0) / (Nb − 2); keep {J : p[J] > α μ} ∪ {0, Nb − 1};
//              when fewer than kBlocks blocks pass (both ends counted if they pass), the
//              kBlocks best instead, ∪ {0, Nb − 1}; Nb <= 2: every block;
//   PE heads:  the peK best of each direction, ∪ {0} (the sink column, the diagonal); with peWithVs
//              (Policy.peWithVs) ∪ the VS heads' rule too.
// "Best": higher score first, ties toward the lower index. Lists come out ascending and
// duplicate-free through a bitmap of the head's Nb blocks in shared memory, compacted in
// index order.
//
// Shape legend: H heads, Nb blocks; p [H][Nb] f64 per direction; routes [H] (1 = VS, 0 = PE).
#include "../common/crisp-common.cuh"

#define SEL_T 256

// (v, i) ranks before (w, j): higher score first, ties toward the lower index.
__device__ __forceinline__ bool sel_before(double v, int i, double w, int j) { return v > w || (v == w && i < j); }

// (v, i) into the best so far (bv, bi) when it ranks before it; 0x7fffffff: no block.
__device__ __forceinline__ void sel_keep(double& bv, int& bi, double v, int i) {
  if (i != 0x7fffffff && (bi == 0x7fffffff || sel_before(v, i, bv, bi))) {
    bv = v;
    bi = i;
  }
}

// Set the bits of the k best blocks of p (k < Nb), one block-wide argmax a round: round r
// takes the best block ranked after round r − 1's winner. A round: each thread's best of its
// strided blocks, each warp's by shuffles, then every thread the best of the warps' (sv, si:
// one slot a warp). "Before" is a total order (score, then index), so the winner is the same
// in any reduction order. (A shared-memory tree, 9 barriers a round, was slower.)
__device__ void sel_topk_bits(const double* p, int Nb, int k, u32* bits, double* sv, int* si) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  double pv = __longlong_as_double(0x7ff0000000000000ULL);  // +inf, index −1: before everything
  int pi = -1;
  for (int r = 0; r < k; r++) {
    double bv = 0.0;
    int bi = 0x7fffffff;  // none
    for (int J = t; J < Nb; J += SEL_T) {
      const double v = p[J];
      if (sel_before(pv, pi, v, J)) sel_keep(bv, bi, v, J);  // (blocks ranked after the last winner)
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      sel_keep(bv, bi, ov, oi);
    }
    if (lane == 0) {
      sv[warp] = bv;
      si[warp] = bi;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < SEL_T / 32; w++) sel_keep(bv, bi, sv[w], si[w]);
    pv = bv;
    pi = bi;
    if (t == 0 && pi != 0x7fffffff) bits[pi >> 5] |= 1u << (pi & 31);
    __syncthreads();  // (every thread has read the slots before the next round writes them)
  }
}

// Grid (2 directions, H heads), SEL_T threads, Nb/32 words of dynamic shared memory. lists
// [2][H][Nb]: the selected blocks ascending; counts [2][H]. peWithVs: PE heads take the VS
// rule's blocks as well.
extern "C" __global__ void __launch_bounds__(SEL_T) vs_select(const double* pv, const double* ps, const int* routes,
                                                              int H, int Nb, double alpha, int kBlocks, int peK,
                                                              int* lists, int* counts, int peWithVs) {
  CRISP_PDL_ENTRY();
  extern __shared__ u32 bits[];
  __shared__ double sv[SEL_T / 32];  // sel_topk_bits: one slot a warp
  __shared__ int si[SEL_T / 32];
  __shared__ int red[SEL_T / 32];
  const int dir = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
  const int words = (Nb + 31) >> 5;
  const double* p = (dir == 0 ? pv : ps) + (size_t)h * Nb;
  for (int w = t; w < words; w += SEL_T) bits[w] = 0u;
  __syncthreads();
  auto setBit = [&](int J) { atomicOr(&bits[J >> 5], 1u << (J & 31)); };
  const bool vsHead = routes[h] != 0;
  if (vsHead || peWithVs) {
    if (Nb <= 2) {
      if (t < Nb) setBit(t);
    } else {
      const double th = alpha * (fmax(1.0 - p[0] - p[Nb - 1], 0.0) / (double)(Nb - 2));
      int c = 0;
      for (int J = 1 + t; J < Nb - 1; J += SEL_T) {
        if (p[J] > th) {
          setBit(J);
          c++;
        }
      }
      const int count = cta_sum<SEL_T>(c, red) + (p[0] > th ? 1 : 0) + (p[Nb - 1] > th ? 1 : 0);
      if (count < kBlocks) {
        for (int w = t; w < words; w += SEL_T) bits[w] = 0u;
        __syncthreads();
        if (kBlocks >= Nb) {
          for (int J = t; J < Nb; J += SEL_T) setBit(J);
        } else {
          sel_topk_bits(p, Nb, kBlocks, bits, sv, si);
        }
      }
      __syncthreads();
      if (t == 0) {
        setBit(0);
        setBit(Nb - 1);
      }
    }
  }
  if (!vsHead) {
    // (the VS rule's bits, when it ran, are all set: sel_topk_bits' thread 0 adds to them)
    __syncthreads();
    if (peK >= Nb) {
      for (int J = t; J < Nb; J += SEL_T) setBit(J);
    } else if (peK > 0) {
      sel_topk_bits(p, Nb, peK, bits, sv, si);
    }
    __syncthreads();
    if (t == 0) setBit(0);
  }
  __syncthreads();
  // compact the bitmap in index order: thread t owns words [w0, w1)
  const int per = (words + SEL_T - 1) / SEL_T;
  const int w0 = t * per < words ? t * per : words, w1 = w0 + per < words ? w0 + per : words;
  int own = 0;
  for (int w = w0; w < w1; w++) own += __popc(bits[w]);
  // this thread's first output position, and the list's length
  int total;
  int run = cta_exclusive_sum<SEL_T>(own, red, total);
  int* out = lists + ((size_t)dir * H + h) * Nb;
  for (int w = w0; w < w1; w++) {
    u32 b = bits[w];
    while (b) {
      const int j = __ffs(b) - 1;
      b &= b - 1;
      out[run++] = w * 32 + j;
    }
  }
  if (t == 0) counts[dir * H + h] = total;
}

// The selected lists as VS lists: buf = [verticalPtr H+1][slashPtr H+1][vertical H·Nb][slash H·Nb]
// (ptrs exclusive sums of the counts in head order). Grid (2, H), SEL_T threads.
extern "C" __global__ void __launch_bounds__(SEL_T) vs_pack(const int* lists, const int* counts, int H, int Nb,
                                                            int* buf) {
  CRISP_PDL_ENTRY();
  const int dir = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
  int off = 0;
  for (int g = 0; g < h; g++) off += counts[dir * H + g];
  const int c = counts[dir * H + h];
  int* ptr = buf + dir * (H + 1);
  int* flat = buf + 2 * (H + 1) + (size_t)dir * H * Nb;
  if (t == 0) {
    if (h == 0) ptr[0] = 0;
    ptr[h + 1] = off + c;
  }
  const int* src = lists + ((size_t)dir * H + h) * Nb;
  for (int i = t; i < c; i += SEL_T) flat[off + i] = src[i];
}
