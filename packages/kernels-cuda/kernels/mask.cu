// VS-to-rows expansion on the GPU and the row-pointer scan.
//
// Shape legend: H heads, Nb blocks; a mask is, per head, sorted vertical key blocks J
// (activate (I, J) for I >= J), sorted slash offsets O (activate (I, I − O) for I >= O),
// and/or BSR rows (rowPtr [H * Nb + 1], cols). Output: the union as BSR rows, each row's
// key blocks strictly increasing. One thread per row merges three sorted streams:
// verticals ascending, slashes walked from the largest O <= I down (ascending J), and the
// row's own cols.
#include "crisp-common.cuh"

__device__ __forceinline__ int upper_bound_le(const int* a, int lo, int hi, int x) {
  // first index in [lo, hi) with a[i] > x
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (a[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// write == nullptr: count only (into counts[row]); else write at outCols[outPtr[row]..].
__device__ __forceinline__ int merge_row(int h, int I, int Nb, const int* vPtr, const int* vert, const int* sPtr,
                                         const int* slash, const int* rPtr, const int* rCols, int* write) {
  int vi = 0, ve = 0, si = 0, sLo = 0, ri = 0, re = 0;
  if (vPtr != nullptr) {
    vi = vPtr[h];
    ve = upper_bound_le(vert, vPtr[h], vPtr[h + 1], I);
    sLo = sPtr[h];
    si = upper_bound_le(slash, sPtr[h], sPtr[h + 1], I) - 1;  // walk down to sLo
  } else {
    si = -1;
  }
  if (rPtr != nullptr) {
    ri = rPtr[h * Nb + I];
    re = rPtr[h * Nb + I + 1];
  }
  int count = 0, last = -1;
  const int BIG = 0x7fffffff;
  for (;;) {
    const int a = vi < ve ? vert[vi] : BIG;
    const int b = (vPtr != nullptr && si >= sLo) ? I - slash[si] : BIG;
    const int c = ri < re ? rCols[ri] : BIG;
    int m = a < b ? a : b;
    m = m < c ? m : c;
    if (m == BIG) break;
    if (a == m) vi++;
    if (b == m) si--;
    if (c == m) ri++;
    if (m != last) {
      if (write != nullptr) write[count] = m;
      count++;
      last = m;
    }
  }
  return count;
}

// Also validates the BSR entries (the host checked rowPtr, not the entries: at 512k there
// are tens of millions): each row's cols strictly increasing and inside [0, I]. The first
// offending row (lowest index) lands in *bad, which the host initialises to INT_MAX.
extern "C" __global__ void expand_count(const int* vPtr, const int* vert, const int* sPtr, const int* slash,
                                       const int* rPtr, const int* rCols, int* counts, int H, int Nb, int* bad) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= H * Nb) return;
  const int I = row % Nb;
  if (rPtr != nullptr) {
    int prev = -1;
    for (int p = rPtr[row]; p < rPtr[row + 1]; p++) {
      const int c = rCols[p];
      if (c <= prev || c > I) {
        atomicMin(bad, row);
        counts[row] = 0;
        return;
      }
      prev = c;
    }
  }
  counts[row] = merge_row(row / Nb, I, Nb, vPtr, vert, sPtr, slash, rPtr, rCols, nullptr);
}

extern "C" __global__ void expand_write(const int* vPtr, const int* vert, const int* sPtr, const int* slash,
                                       const int* rPtr, const int* rCols, const int* outPtr, int* outCols, int H,
                                       int Nb) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= H * Nb) return;
  merge_row(row / Nb, row % Nb, Nb, vPtr, vert, sPtr, slash, rPtr, rCols, outCols + outPtr[row]);
}

extern "C" __global__ void __launch_bounds__(1024) exclusive_scan(const int* in, int* out, int N) {
  cta_exclusive_scan(in, out, N);
}

// Count NaN/Inf elements of a 16-bit float tensor (exponent all ones): inputs are checked
// before any primitive so bad values raise NON_FINITE instead of hiding in a softmax.
// expMask: 0x7f80 for bf16, 0x7c00 for f16. *count must be zeroed first.
extern "C" __global__ void count_nonfinite(const u16* x, u64 count, u32 expMask, u32* out) {
  u32 c = 0;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
    c += ((u32)x[i] & expMask) == expMask;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(out, c);
}
