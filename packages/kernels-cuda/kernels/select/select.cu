// VS index selection on the device, for selectors with an exact device form (the noise floor
// and FlexPrefill's cumulative coverage, core's DeviceSelectorRule): the plan's block scores p_v / p_s stay where proxy_blocks wrote
// them, and the host reads back only the selected lists. The rules and the tie order are
// @crisp/select's, in the same f64 arithmetic, so the lists are the host selector's:
//   VS heads:  μ = max(1 − p[0] − p[Nb−1], 0) / (Nb − 2); keep {J : p[J] > α μ} ∪ {0, Nb − 1};
//              when fewer than kBlocks blocks pass (both ends counted if they pass), the
//              kBlocks best instead, ∪ {0, Nb − 1}; Nb <= 2: every block;
//   PE heads:  the peK best of each direction, ∪ {0} (the sink column, the diagonal); with peWithVs
//              (Policy.peWithVs) ∪ the VS heads' rule too; with excess κ > 0 as well
//              (Policy.peVsExcess) only the rule's vertical blocks with p_v[J] > κ · ā[J] and
//              none of its slash blocks, unless the head's C_struct lies in [fullFrom,
//              fullBelow) (Policy.peVsFullAnchor).
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

// The bitmap's blocks in index order into out, their number into *count: thread t owns the
// words [w0, w1) (red: SEL_T / 32 ints, as cta_exclusive_sum's).
__device__ void sel_write_list(const u32* bits, int words, int* out, int* count, int* red) {
  const int t = threadIdx.x;
  const int per = (words + SEL_T - 1) / SEL_T;
  const int w0 = t * per < words ? t * per : words, w1 = w0 + per < words ? w0 + per : words;
  int own = 0;
  for (int w = w0; w < w1; w++) own += __popc(bits[w]);
  // this thread's first output position, and the list's length
  int total;
  int run = cta_exclusive_sum<SEL_T>(own, red, total);
  for (int w = w0; w < w1; w++) {
    u32 b = bits[w];
    while (b) {
      const int j = __ffs(b) - 1;
      b &= b - 1;
      out[run++] = w * 32 + j;
    }
  }
  if (t == 0) *count = total;
}

// Grid (2 directions, H heads), SEL_T threads, Nb/32 words of dynamic shared memory. lists
// [2][H][Nb]: the selected blocks ascending; counts [2][H]. peWithVs: PE heads take the VS
// rule's blocks as well, at their own α (alphaPe; equal to alpha when one rule serves both);
// excess > 0: narrowed as above, reading the pooled estimate ā [H][Nb] and C_struct [H]
// (both unread when excess is 0).
extern "C" __global__ void __launch_bounds__(SEL_T) vs_select(const double* pv, const double* ps, const int* routes,
                                                              int H, int Nb, double alpha, double alphaPe, int kBlocks, int peK,
                                                              int* lists, int* counts, int peWithVs,
                                                              const double* pooled, const double* cStruct,
                                                              double excess, double fullFrom, double fullBelow) {
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
      const double th = (vsHead ? alpha : alphaPe) * (fmax(1.0 - p[0] - p[Nb - 1], 0.0) / (double)(Nb - 2));
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
  if (!vsHead && peWithVs && excess > 0.0 && !(cStruct[h] >= fullFrom && cStruct[h] < fullBelow)) {
    // narrowed: of the rule's vertical blocks only those the pooled map under-reads by κ, of
    // its slash blocks none (the peK best and {0} are added below either way)
    __syncthreads();
    const double* a = pooled + (size_t)h * Nb;
    for (int w = t; w < words; w += SEL_T) {
      u32 keep = 0u;
      if (dir == 0) {
        for (u32 b = bits[w]; b; b &= b - 1) {
          const int J = w * 32 + __ffs(b) - 1;
          if (p[J] > excess * a[J]) keep |= 1u << (J & 31);
        }
      }
      bits[w] = keep;
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
  sel_write_list(bits, words, lists + ((size_t)dir * H + h) * Nb, counts + dir * H + h, red);
}

// ---------------------------------------------------------------------------------------------
// FlexPrefill's cumulative coverage (@crisp/select's cumulativeCoverage) on VS heads:
//   count  = the position, in the token scores a sorted descending, where their running sum
//            first exceeds γ (n + 1 when it never does);
//   blocks = min(Nb, max(kBlocks, floor(count / B) + 1));
//   keep block 0 and the blocks − 1 best of the others (higher score first, ties toward the
//   lower index).
// The host sums the sorted scores in float64. A float32 score >= 2^-29 (exponent field >= 98)
// is a whole multiple of 2^-52, so the sums of such scores below 2 are exact in float64 and do
// not depend on the order: here they are 64-bit integers in units of 2^-52 (cov_fixed), and a
// radix select over the scores' bit patterns (8 bits a pass, highest digit first, the masses
// of each digit's scores added exactly) finds the score where the running sum passes γ, and
// how many equal scores before it are needed. Exact for softmax rows (scores in [0, 1] that
// sum to about 1) with γ <= 0.99: the scores below 2^-29 (n <= 2^20 of them) hold under 2^-9
// of the mass, so the running sum passes γ among the exact ones. A head outside that (a score
// above 1, negative, non-finite, or a crossing among the tiny scores) keeps every block:
// never less than the host's set; the device form is offered only for γ <= 0.99.
#define COV_EXACT_BYTE 49  // top byte of the float32 patterns >= 2^-29 (exponent field 98)

// A float32 pattern of a score in [2^-29, 1], times 2^52 (exact: the mantissa shifted left by
// the exponent above 98, at most 29 places).
__device__ __forceinline__ u64 cov_fixed(u32 x) {
  return (u64)((x & 0x7fffffu) | 0x800000u) << ((x >> 23) - 98u);
}

// An f64 score's bit pattern mapped so that unsigned order is the value's order.
__device__ __forceinline__ u64 cov_key(double v) {
  const u64 b = (u64)__double_as_longlong(v);
  return (b >> 63) ? ~b : (b | 0x8000000000000000ULL);
}

// Sets the bits of the k best blocks among 1..Nb−1 (k < Nb − 1) by a radix select over their
// keys: the k-th best key K, every block above it, then the blocks equal to K from the lowest
// index (thread 0 alone: ties are few). cnt: 256 shared words; sh: 2 shared u64.
__device__ void cov_topk_bits(const double* p, int Nb, int k, u32* bits, u32* cnt, u64* sh) {
  const int t = threadIdx.x;
  if (t == 0) {
    sh[0] = 0ULL;       // the key's digits so far
    sh[1] = (u64)k;     // how many still to take at or below them
  }
  for (int pass = 0; pass < 8; pass++) {
    const int shift = 56 - 8 * pass;
    cnt[t] = 0u;  // (SEL_T == 256: one word a thread)
    __syncthreads();
    const u64 prefix = sh[0];
    for (int J = 1 + t; J < Nb; J += SEL_T) {
      const u64 key = cov_key(p[J]);
      if (pass == 0 || (key >> (shift + 8)) == prefix) atomicAdd(&cnt[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (t == 0) {
      u64 need = sh[1];
      int d = 255;
      for (; d > 0 && (u64)cnt[d] < need; d--) need -= cnt[d];
      sh[0] = (prefix << 8) | (u64)d;
      sh[1] = need;
    }
    __syncthreads();
  }
  const u64 K = sh[0];
  for (int J = 1 + t; J < Nb; J += SEL_T) {
    if (cov_key(p[J]) > K) atomicOr(&bits[J >> 5], 1u << (J & 31));
  }
  if (t == 0) {
    u64 need = sh[1];
    for (int J = 1; J < Nb && need > 0; J++) {
      if (cov_key(p[J]) == K) {
        atomicOr(&bits[J >> 5], 1u << (J & 31));
        need--;
      }
    }
  }
  __syncthreads();
}

// Thread-block clusters (sm_90): cov_count's histograms are split over the COV_CL CTAs of a
// cluster, each scanning every COV_CL-th stretch of the scores, and every CTA sums the others'
// through distributed shared memory before it decides (the same integers in every CTA, so the
// same decision). One CTA a direction and head left 68 of 132 SMs idle and each SM waiting on
// its loads (a profile at 512k: 91% of cycles with no eligible warp).
#define COV_CL 8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define COV_HAS_CLUSTER 1
__device__ __forceinline__ u32 cl_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// every thread of every CTA of the cluster: writes before it are visible to reads after it
__device__ __forceinline__ void cl_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// the address of this CTA's shared variable p in the shared memory of the cluster's CTA `rank`
__device__ __forceinline__ u32 cl_map(const void* p, u32 rank) {
  u32 a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
  return a;
}
__device__ __forceinline__ u32 cl_ld32(u32 a) {
  u32 v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ u64 cl_ld64(u32 a) {
  u64 v;
  asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(a) : "memory");
  return v;
}
#else
#define COV_HAS_CLUSTER 0
#endif

// The count of one direction's n token scores a (see above), or −1 where it is not exact.
// cnt: 256 shared words, mass: 256 shared u64, sh: 4 shared u64. CL > 1: this CTA is `rank`
// of a cluster of CL that count the same scores together (every CTA returns the count).
// A warp whose 32 lanes all count a score of the same digit adds once (the first pass's
// scores nearly all share their top byte: one shared address for every lane otherwise).
template <int CL>
__device__ long long cov_count(const float* a, int n, u64 T, u32* cnt, u64* mass, u64* sh, int rank) {
  const int t = threadIdx.x, lane = t & 31;
  const u32* bits = reinterpret_cast<const u32*>(a);
  if (t == 0) {
    sh[0] = 0ULL;  // the crossing score's digits so far
    sh[1] = 0ULL;  // the mass of the scores above them (units of 2^-52)
    sh[2] = 0ULL;  // how many scores are above them
    sh[3] = 0ULL;  // 1: decided (the result in sh[2]); 2: not exact
  }
  __shared__ int bad;
  __shared__ u32 sumCnt[CL > 1 ? 256 : 1];
  __shared__ u64 sumMass[CL > 1 ? 256 : 1];
  u32* allCnt = CL > 1 ? sumCnt : cnt;
  u64* allMass = CL > 1 ? sumMass : mass;
  if (t == 0) bad = 0;
  for (int pass = 0; pass < 4; pass++) {
    const int shift = 24 - 8 * pass;
    cnt[t] = 0u;
    mass[t] = 0ULL;
    __syncthreads();
    const u64 prefix = sh[0];
    // the same trip count for every lane of a warp (the warp votes below)
    for (int base = rank * SEL_T + (t & ~31); base < n; base += CL * SEL_T) {
      const int i = base + lane;
      const u32 x = i < n ? bits[i] : 0u;
      bool take;
      u32 d;
      u64 m = 0ULL;
      if (pass == 0) {
        // above 1, negative (−0 too), Inf or NaN: not a softmax score
        if (i < n && x > 0x3f800000u) bad = 1;
        take = i < n && x <= 0x3f800000u;
        d = x >> 24;
        if (take && d >= COV_EXACT_BYTE) m = cov_fixed(x);
      } else {
        take = i < n && (u64)(x >> (shift + 8)) == prefix;
        d = (x >> shift) & 255u;
        if (take) m = cov_fixed(x);
      }
      const u32 d0 = __shfl_sync(0xffffffffu, d, 0);
      if (__all_sync(0xffffffffu, take && d == d0)) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
        if (lane == 0) {
          atomicAdd(&cnt[d0], 32u);
          if (m != 0ULL) atomicAdd(&mass[d0], m);
        }
      } else if (take) {
        atomicAdd(&cnt[d], 1u);
        if (m != 0ULL) atomicAdd(&mass[d], m);
      }
    }
    __syncthreads();
    int anyBad = bad;
#if COV_HAS_CLUSTER
    if (CL > 1) {
      __shared__ int sumBad;
      cl_sync();  // every CTA's histograms are complete
      u32 c = 0u;
      u64 ms = 0ULL;
      for (int r = 0; r < CL; r++) {
        c += cl_ld32(cl_map(&cnt[t], (u32)r));
        ms += cl_ld64(cl_map(&mass[t], (u32)r));
      }
      sumCnt[t] = c;
      sumMass[t] = ms;
      if (t == 0) {
        int b = 0;
        for (int r = 0; r < CL; r++) b |= (int)cl_ld32(cl_map(&bad, (u32)r));
        sumBad = b;
      }
      cl_sync();  // every CTA has read the others' before any clears its own
      anyBad = sumBad;
    }
#endif
    if (t == 0) {
      u64 M = sh[1], C = sh[2];
      const int lowest = pass == 0 ? COV_EXACT_BYTE : 0;
      int cross = -1;
      for (int d = 255; d >= lowest; d--) {
        if (M + allMass[d] > T) {
          cross = d;
          break;
        }
        M += allMass[d];
        C += allCnt[d];
      }
      if (anyBad) {
        sh[3] = 2ULL;
      } else if (cross < 0) {
        // the whole mass stays <= γ: n + 1 when every score was exact, else undecided
        u64 tiny = 0;
        if (pass == 0)
          for (int d = 0; d < COV_EXACT_BYTE; d++) tiny += allCnt[d];
        sh[3] = pass == 0 && tiny == 0 ? 1ULL : 2ULL;
        sh[2] = C + 1;
      } else {
        sh[0] = (prefix << 8) | (u64)cross;
        sh[1] = M;
        sh[2] = C;
      }
    }
    __syncthreads();
    if (sh[3] != 0ULL) break;
  }
  long long r;
  if (sh[3] == 1ULL) {
    r = (long long)sh[2];
  } else if (sh[3] == 2ULL) {
    r = -1;
  } else {
    // sh[0] is the crossing score's pattern: the j-th of the equal scores passes γ
    const u64 v = cov_fixed((u32)sh[0]);
    r = (long long)(sh[2] + (T - sh[1]) / v + 1ULL);
  }
  __syncthreads();  // (every thread has read sh before cov_topk_bits writes it)
  return r;
}

// pv, ps [H][Nb] f64 (the block scores), av, as [H][n] f32 (the token scores a_v, a_s); T =
// floor(γ · 2^52); lists [2][H][Nb], counts [2][H] as vs_select's. PE heads as vs_select's:
// the peK best of each direction ∪ {0}, and the coverage rule's blocks too with peWithVs.
// Grid (2 directions, H heads, CL), SEL_T threads, Nb/32 words of dynamic shared memory; with
// CL > 1 the CL CTAs of a (direction, head) are one cluster: all count, the first selects.
template <int CL>
__device__ __forceinline__ void coverage_body(const double* pv, const double* ps, const float* av, const float* as,
                                              const int* routes, int H, int Nb, int n, int B, u64 T, int kBlocks,
                                              int peK, int* lists, int* counts, int peWithVs, int rank,
                                              u32* bits) {
  __shared__ double sv[SEL_T / 32];  // sel_topk_bits: one slot a warp
  __shared__ int si[SEL_T / 32];
  __shared__ int red[SEL_T / 32];
  __shared__ u32 cnt[256];
  __shared__ u64 mass[256];
  __shared__ u64 sh[4];
  const int dir = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
  const int words = (Nb + 31) >> 5;
  const double* p = (dir == 0 ? pv : ps) + (size_t)h * Nb;
  for (int w = t; w < words; w += SEL_T) bits[w] = 0u;
  __syncthreads();
  const bool vsHead = routes[h] != 0;
  if (vsHead || peWithVs) {
    const long long count = cov_count<CL>((dir == 0 ? av : as) + (size_t)h * n, n, T, cnt, mass, sh, rank);
    if (rank != 0) return;
    const long long want = count < 0 ? (long long)Nb : count / B + 1;
    const int blocks = (int)min((long long)Nb, max((long long)kBlocks, want));
    if (blocks >= Nb) {
      for (int J = t; J < Nb; J += SEL_T) atomicOr(&bits[J >> 5], 1u << (J & 31));
    } else if (blocks > 1) {
      cov_topk_bits(p, Nb, blocks - 1, bits, cnt, sh);
    }
    __syncthreads();
    if (t == 0) atomicOr(&bits[0], 1u);
  }
  if (rank != 0) return;
  if (!vsHead) {
    __syncthreads();
    if (peK >= Nb) {
      for (int J = t; J < Nb; J += SEL_T) atomicOr(&bits[J >> 5], 1u << (J & 31));
    } else if (peK > 0) {
      sel_topk_bits(p, Nb, peK, bits, sv, si);
    }
    __syncthreads();
    if (t == 0) atomicOr(&bits[0], 1u);
  }
  __syncthreads();
  sel_write_list(bits, words, lists + ((size_t)dir * H + h) * Nb, counts + dir * H + h, red);
}

// One CTA a direction and head (GPUs before sm_90). Grid (2, H).
extern "C" __global__ void __launch_bounds__(SEL_T) coverage_select(const double* pv, const double* ps, const float* av,
                                                                    const float* as, const int* routes, int H, int Nb,
                                                                    int n, int B, unsigned long long T, int kBlocks,
                                                                    int peK, int* lists, int* counts, int peWithVs) {
  CRISP_PDL_ENTRY();
  extern __shared__ u32 bits[];  // Nb/32 words: the head's bitmap
  coverage_body<1>(pv, ps, av, as, routes, H, Nb, n, B, T, kBlocks, peK, lists, counts, peWithVs, 0, bits);
}

// sm_90: a cluster of COV_CL CTAs a direction and head. Grid (2, H, COV_CL). Elsewhere it
// traps (the host launches it only on sm_90 and later).
#if COV_HAS_CLUSTER
#define COV_CLUSTER_DIMS __cluster_dims__(1, 1, COV_CL)
#else
#define COV_CLUSTER_DIMS
#endif
extern "C" __global__ void __launch_bounds__(SEL_T) COV_CLUSTER_DIMS
    coverage_select_c8(const double* pv, const double* ps, const float* av, const float* as, const int* routes, int H,
                       int Nb, int n, int B, unsigned long long T, int kBlocks, int peK, int* lists, int* counts,
                       int peWithVs) {
  CRISP_PDL_ENTRY();
#if COV_HAS_CLUSTER
  extern __shared__ u32 bits[];
  coverage_body<COV_CL>(pv, ps, av, as, routes, H, Nb, n, B, T, kBlocks, peK, lists, counts, peWithVs,
                        (int)cl_rank(), bits);
#else
  __trap();
#endif
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
