// VS-to-rows expansion on the GPU and the row-pointer scan.
//
// Shape legend: H heads, Nb blocks; a mask is, per head, sorted vertical key blocks J
// (activate (I, J) for I >= J), sorted slash offsets O (activate (I, I − O) for I >= O),
// and/or BSR rows (rowPtr [H * Nb + 1], cols). Output: the union as BSR rows, each row's
// key blocks strictly increasing. expand_count sizes each row and expand_write fills it, a
// warp per row in both. With `route` (a device plan: [H], 1 = VS) only the heads routed
// `want` get rows; the others' rows are empty (the plan expands its VS heads before the
// attention and its PE heads beside it).
#include "../common/crisp-common.cuh"

// Row (h, I)'s entries in the block rows: rPtr is every head's [H·Nb + 1], or, with a head
// list hl = [nh][heads ascending] (uploaded, or written by the device router), the listed
// heads' [nh·Nb + 1], and the other heads' rows are empty (no separate launch spreads the
// rows to every head).
__device__ __forceinline__ void row_range(const int* rPtr, const int* hl, int h, int I, int Nb, int& ri, int& re) {
  int row = h * Nb + I;
  if (hl != nullptr) {
    const int nh = hl[0];
    int s = 0;
    while (s < nh && hl[1 + s] < h) s++;
    if (s == nh || hl[1 + s] != h) {
      ri = re = 0;
      return;
    }
    row = s * Nb + I;
  }
  ri = rPtr[row];
  re = rPtr[row + 1];
}

// Row (h, I)'s union of its own cols, its vertical blocks J <= I and its slash blocks I - O
// (O <= I) as bits in a bitmap of the row's key blocks [0, I] in shared memory (ceil(Nb / 32)
// words a warp), one warp per row. The lanes stride over each sorted list and stop at the
// first entry past the row (no binary search: a search's ~10 dependent global loads a row were
// most of both kernels' time). Sorted lists: the host validated V and S as
// strictly increasing; the row's own cols are validated by expand_count (every bit lands
// inside [0, I]). Returns W, the words holding [0, I].
__device__ __forceinline__ int row_bitmap(u32* bits, const int* vPtr, const int* vert, const int* sPtr,
                                          const int* slash, const int* rCols, int ri, int re, int h, int I,
                                          int lane) {
  const int W = (I >> 5) + 1;
  for (int w = lane; w < W; w += 32) bits[w] = 0u;
  __syncwarp();
  for (int p = ri + lane; p < re; p += 32) {
    const int c = rCols[p];
    atomicOr(&bits[c >> 5], 1u << (c & 31));
  }
  if (vPtr != nullptr) {
    // (warp-uniform trip counts: the vote needs every lane)
    const int v1 = vPtr[h + 1], s1 = sPtr[h + 1];
    for (int i0 = vPtr[h]; i0 < v1; i0 += 32) {
      const int c = i0 + lane < v1 ? vert[i0 + lane] : 0x7fffffff;
      if (__all_sync(0xffffffffu, c > I)) break;  // (sorted: every later entry is past the row too)
      if (c <= I) atomicOr(&bits[c >> 5], 1u << (c & 31));
    }
    for (int i0 = sPtr[h]; i0 < s1; i0 += 32) {
      const int o = i0 + lane < s1 ? slash[i0 + lane] : 0x7fffffff;
      if (__all_sync(0xffffffffu, o > I)) break;
      if (o <= I) {
        const int c = I - o;
        atomicOr(&bits[c >> 5], 1u << (c & 31));
      }
    }
  }
  __syncwarp();
  return W;
}

// The row's length (the union's popcount; a row of BSR entries alone, their count), one warp
// per row. Also validates the BSR entries
// (the host checked rowPtr, not the entries: at 512k there are tens of millions): each row's
// cols strictly increasing and inside [0, I]. The first offending row (lowest index) lands in
// *bad, which the host initialises to CRISP_NO_BAD_ROW. (Counting |R| + |V \ R| + |S \ (R ∪ V)|
// by binary searches was slower; a thread walking a row took 2.5 ms at 512k.)
extern "C" __global__ void expand_count(const int* vPtr, const int* vert, const int* sPtr, const int* slash,
                                       const int* rPtr, const int* rCols, const int* hl, const int* route, int want,
                                       int* counts, int H, int Nb, int* bad) {
  CRISP_PDL_ENTRY();
  extern __shared__ u32 bitmaps[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + warp;  // uniform in the warp
  if (row >= H * Nb) return;
  const int I = row % Nb, h = row / Nb;
  if (route != nullptr && route[h] != want) {
    // another route's head (a device plan expands its VS and PE heads apart): an empty row
    if (lane == 0) counts[row] = 0;
    return;
  }
  int ri = 0, re = 0;
  if (rPtr != nullptr) {
    row_range(rPtr, hl, h, I, Nb, ri, re);
    bool ok = true;
    for (int p = ri + lane; p < re; p += 32) {
      const int c = rCols[p];
      const int prev = p > ri ? rCols[p - 1] : -1;
      ok = ok && c > prev && c <= I;
    }
    if (__any_sync(0xffffffffu, !ok)) {
      if (lane == 0) {
        atomicMin(bad, row);
        counts[row] = 0;
      }
      return;
    }
  }
  if (vPtr == nullptr) {
    // the row's own cols alone, strictly increasing (checked above): no union to count
    if (lane == 0) counts[row] = re - ri;
    return;
  }
  const int words = (Nb + 31) >> 5;
  u32* bits = bitmaps + warp * words;
  const int W = row_bitmap(bits, vPtr, vert, sPtr, slash, rCols, ri, re, h, I, lane);
  int c = 0;
  for (int w = lane; w < W; w += 32) c += __popc(bits[w]);
  c = warp_sum(c);
  if (lane == 0) counts[row] = c;
}

// The row's union written in ascending order, one warp per row, from the same bitmap as
// expand_count's (so its length is expand_count's): the warp takes the words 32 at a time and
// walks the non-empty ones, each a coalesced store of its set bits (lane l writes key block
// 32w + l when bit l is set, at the popcount of the bits below it). Runs after expand_count has
// validated the rows' entries: the host reads *bad first, or (a plan that reads nothing back)
// every warp leaves once a row was flagged bad, so no bit lands outside its row's bitmap and no
// row outside the room the host made (I + 1 a row). (A lane serially writing its own word's
// bits, stores scattered over the row, and binary searches for the lists' ends took 0.058 ms
// at 128k; a thread a row, 0.73 ms at 512k.)
extern "C" __global__ void expand_write(const int* vPtr, const int* vert, const int* sPtr, const int* slash,
                                       const int* rPtr, const int* rCols, const int* hl, const int* route, int want,
                                       const int* outPtr, int* outCols, int H, int Nb, const int* bad) {
  CRISP_PDL_ENTRY();
  if (*bad != CRISP_NO_BAD_ROW) return;
  extern __shared__ u32 bitmaps[];
  const int words = (Nb + 31) >> 5;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + warp;  // uniform in the warp
  if (row >= H * Nb) return;
  const int I = row % Nb, h = row / Nb;
  if (route != nullptr && route[h] != want) return;  // expand_count's empty row
  int ri = 0, re = 0;
  if (rPtr != nullptr) row_range(rPtr, hl, h, I, Nb, ri, re);
  u32* bits = bitmaps + warp * words;
  const int W = row_bitmap(bits, vPtr, vert, sPtr, slash, rCols, ri, re, h, I, lane);
  int* out = outCols + outPtr[row];
  int base = 0;
  const u32 below = (1u << lane) - 1u;
  for (int w0 = 0; w0 < W; w0 += 32) {
    const u32 x = w0 + lane < W ? bits[w0 + lane] : 0u;
    u32 nz = __ballot_sync(0xffffffffu, x != 0u);
    while (nz != 0u) {
      const int k = __ffs(nz) - 1;
      nz &= nz - 1u;
      const u32 word = __shfl_sync(0xffffffffu, x, k);
      if ((word >> lane) & 1u) out[base + __popc(word & below)] = ((w0 + k) << 5) + lane;
      base += __popc(word);
    }
  }
}

// Row-pointer scan: out[0..N) = exclusive prefix sums of in[0..N), out[N] = the total, over
// tiles of 4096 ints (256 threads, 16 consecutive ints a thread, int4 loads and stores when
// the pointers allow). exclusive_scan_sums writes each tile's sum; exclusive_scan_tiles has
// every tile add up the sums of the tiles before it (a few hundred at most: H · Nb / 4096)
// and scan its own. Sums in u32, so they wrap as the int sums did, and integer sums are the
// same in any order. Replaces one 1024-thread CTA (0.15 ms at H · Nb = 131,072 on the H200):
// two launches over N / 4096 CTAs; a single tile (N <= 4096) needs only the second.
#define SCAN_THREADS 256
#define SCAN_ITEMS 16
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

__device__ __forceinline__ void scan_load(const int* in, int N, int i0, u32 (&v)[SCAN_ITEMS]) {
  if (i0 + SCAN_ITEMS <= N && (reinterpret_cast<size_t>(in) & 15) == 0) {
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; k += 4) {
      const int4 x = __ldg(reinterpret_cast<const int4*>(in + i0 + k));
      v[k] = (u32)x.x;
      v[k + 1] = (u32)x.y;
      v[k + 2] = (u32)x.z;
      v[k + 3] = (u32)x.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; k++) v[k] = i0 + k < N ? (u32)__ldg(in + i0 + k) : 0u;
  }
}

extern "C" __global__ void __launch_bounds__(SCAN_THREADS) exclusive_scan_sums(const int* in, int* tileSums, int N) {
  CRISP_PDL_ENTRY();
  __shared__ u32 red[SCAN_THREADS / 32];
  u32 v[SCAN_ITEMS];
  scan_load(in, N, blockIdx.x * SCAN_TILE + threadIdx.x * SCAN_ITEMS, v);
  u32 s = 0;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; k++) s += v[k];
  s = cta_sum<SCAN_THREADS>(s, red);
  if (threadIdx.x == 0) tileSums[blockIdx.x] = (int)s;
}

// With `summary` (an expanded mask's; no separate launch writes it),
// also what the host needs of it in one read: summary[h] = out[h·Nb] (h = 0 .. H; summary[H]
// is the total) from the CTA that writes it, and summary[H + 1] = expand_count's bad-row flag.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) exclusive_scan_tiles(const int* in, const int* tileSums,
                                                                                 int* out, int N, int* summary,
                                                                                 int Nb, const int* bad) {
  CRISP_PDL_ENTRY();
  __shared__ u32 red[SCAN_THREADS / 32];
  const int t = threadIdx.x;
  const int i0 = blockIdx.x * SCAN_TILE + t * SCAN_ITEMS;
  u32 v[SCAN_ITEMS];
  scan_load(in, N, i0, v);
  // the tiles before this one
  u32 b = 0;
  for (int k = t; k < (int)blockIdx.x; k += SCAN_THREADS) b += (u32)tileSums[k];
  const u32 base = cta_sum<SCAN_THREADS>(b, red);
  u32 own = 0;
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; k++) own += v[k];
  // the threads' sums before this one
  u32 all;
  u32 run = base + cta_exclusive_sum<SCAN_THREADS>(own, red, all);
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; k++) {
    const u32 c = v[k];
    v[k] = run;
    run += c;
  }
  if (i0 + SCAN_ITEMS <= N && (reinterpret_cast<size_t>(out) & 15) == 0) {
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; k += 4)
      *reinterpret_cast<int4*>(out + i0 + k) = make_int4((int)v[k], (int)v[k + 1], (int)v[k + 2], (int)v[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; k++)
      if (i0 + k < N) out[i0 + k] = (int)v[k];
  }
  if (blockIdx.x == gridDim.x - 1 && t == 0) out[N] = (int)(base + all);
  if (summary != nullptr) {
#pragma unroll
    for (int k = 0; k < SCAN_ITEMS; k++)
      if (i0 + k < N && (i0 + k) % Nb == 0) summary[(i0 + k) / Nb] = (int)v[k];
    if (blockIdx.x == gridDim.x - 1 && t == 0) summary[N / Nb] = (int)(base + all);
    if (blockIdx.x == 0 && t == 0) summary[N / Nb + 1] = *bad;
  }
}

// Count NaN/Inf elements of a 16-bit float tensor (exponent all ones): inputs are checked
// before any primitive so bad values raise NON_FINITE instead of hiding in a softmax.
// expMask: 0x7f80 for bf16, 0x7c00 for f16. *count must be zeroed first.
// 16-byte loads for the whole chunks of 8 when x is 16-byte aligned (the backend's tensors
// are), then the tail one element a thread.
extern "C" __global__ void count_nonfinite(const u16* x, u64 count, u32 expMask, u32* out) {
  u32 c = 0;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
  const bool vec = ((u64)x & 15u) == 0;
  const u64 chunks = vec ? count / 8 : 0;
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  for (u64 i = tid; i < chunks; i += stride) {
    const uint4 w = __ldg(x4 + i);
    const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; j++) c += ((words[j] & expMask) == expMask) + (((words[j] >> 16) & expMask) == expMask);
  }
  for (u64 i = chunks * 8 + tid; i < count; i += stride) c += ((u32)x[i] & expMask) == expMask;
  c = warp_sum(c);
  if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(out, c);
}
