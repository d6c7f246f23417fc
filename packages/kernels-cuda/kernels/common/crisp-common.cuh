// Shared device helpers for the CRISP CUDA kernels. Self-contained (no CUDA headers), so
// NVRTC compiles it without include paths; the host splices it in where a kernel file
// says #include "../common/crisp-common.cuh".
//
// Shape legend: n keys, H query heads, Hkv kv heads, D head dim, B block size,
// Nb = ceil(n / B). Tensors are row-major [rows, heads, D] of 16-bit floats.
#pragma once

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define CRISP_NEG_INF (__int_as_float(0xff800000))
// expand_count's bad-row flag while no row is bad (INT_MAX: atomicMin keeps the lowest bad row);
// the host's NO_BAD_ROW (src/plan-layout.ts)
#define CRISP_NO_BAD_ROW 0x7fffffff

// Programmatic dependent launch (sm_90 and later; nothing elsewhere). The host launches the
// kernels that start with CRISP_PDL_ENTRY with the programmatic-serialisation attribute
// (PDL_KERNELS in src/cuda-backend.ts): such a grid may be scheduled while the kernel before
// it in the stream still runs, once every CTA of that kernel has passed its trigger; its
// griddepcontrol.wait then holds each CTA until that kernel has finished and its writes are
// visible. So the wait comes before any global read or write, and a kernel launched without
// the attribute waits for nothing there. The trigger lets the next kernel's launch overlap
// this one's work (it changes no ordering: the next kernel still waits for all of this one).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#define CRISP_PDL_ENTRY() \
  pdl_wait();             \
  pdl_trigger()

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// 16-byte asynchronous global->shared copy; bytes < 16 zero-fills the rest (used for
// rows past n so no garbage, and no NaN, enters the matrix products).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D(16x8, f32) += A(16x16) * B(16x8), tensor cores.
template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 -> one packed pair (lo in the low half), round to nearest even.
template <bool BF16>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  if (BF16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

template <bool BF16>
__device__ __forceinline__ float to_f32(u16 x) {
  if (BF16) return __uint_as_float(((u32)x) << 16);
  float f;
  asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(x));
  return f;
}

template <bool BF16>
__device__ __forceinline__ u16 from_f32(float x) {
  u32 p = pack2<BF16>(x, 0.f);
  return (u16)(p & 0xffffu);
}

// Swizzled byte offset of the 16-byte chunk `chunk` of row `row` in a tile whose rows are
// rowBytes long (a multiple of 128): XOR with row & 7 keeps ldmatrix conflict-free.
__device__ __forceinline__ u32 swz(int row, int chunk, int rowBytes) {
  return (u32)(row * rowBytes + ((chunk ^ (row & 7)) << 4));
}

// CTA order (hmode >> 2): 0, blockIdx.x is the head slot and blockIdx.y counts query blocks
// from the last, so the longest causal rows start first (dense launches: the tail balances);
// 1, the axes swapped (grid [query blocks, head slots]; block-sparse launches): a head's query
// blocks run together, most recent first, so its vertical blocks and its neighbouring rows'
// slash blocks are read while they are in L2 (crisp's layer at 512k on an H200: 300.6 ms of
// attention against 330.9 ms in the first order; interleaving a kv group's heads with the
// query blocks gave no more. A kv-head-major order for dense was measured on the H200: no gain.)
//
// Which heads a launch serves (hmode & 3): 0, every head; 1, the heads routed to VS (hsel =
// the routes [H], 1 = VS: route.cu's), the other CTAs leave at once; 2, the listed heads
// (hsel = [count][heads], count head slots: a device plan's PE heads, whose rows come later
// on a second stream). Returns false for a CTA that leaves; the bodies call this before any
// barrier or shared-memory setup.
__device__ __forceinline__ bool cta_order(int Nb, const int* hsel, int hmode, int& h, int& I) {
  const bool swapped = (hmode >> 2) == 1;
  const int sel = hmode & 3, slot = (int)(swapped ? blockIdx.y : blockIdx.x);
  h = sel == 2 ? hsel[1 + slot] : slot;
  I = Nb - 1 - (int)(swapped ? blockIdx.x : blockIdx.y);
  return sel != 1 || hsel[h] == 1;
}

// One sequence of a ragged (varlen) batch, as the host packs it (48 bytes, 8-aligned): its
// first query and key rows in the packed q/o and k/v, its own BSR rows (nullptr: dense
// causal), n keys, m queries (the last m of its n positions), Nb key blocks, and the query
// blocks the grid covers (Nb − floor((n − m) / B)).
struct VarSeg {
  long long qRow, kRow;
  const int* rowPtr;
  const int* cols;
  int n, m, Nb, qBlocks;
};

// A varlen launch (segs != nullptr): grid z picks the sequence; this CTA's pointers and sizes
// become that sequence's (lse keeps its packed [H, Mq] stride). Returns false for a CTA past
// the sequence's query blocks (grid y spans the longest sequence), which leaves at once.
template <int D>
__device__ __forceinline__ bool varlen_segment(const VarSeg* segs, const u16*& q, const u16*& k, const u16*& v,
                                               u16*& o, float*& lse, const int*& rowPtr, const int*& cols, int& n,
                                               int& m, int& Nb, int H, int Hkv) {
  if (segs == nullptr) return true;
  const VarSeg s = segs[blockIdx.z];
  if ((int)blockIdx.y >= s.qBlocks) return false;
  const size_t qOff = (size_t)s.qRow * (size_t)H * D, kOff = (size_t)s.kRow * (size_t)Hkv * D;
  q += qOff;
  o += qOff;
  k += kOff;
  v += kOff;
  if (lse != nullptr) lse += s.qRow;
  rowPtr = s.rowPtr;
  cols = s.cols;
  n = s.n;
  m = s.m;
  Nb = s.Nb;
  return true;
}

// The key blocks query block I of head h visits: cols[first .. first + count) of the BSR rows
// (rowPtr [H * Nb + 1]), or, with rowPtr == nullptr (the dense baseline), every J <= I.
// Returns count.
__device__ __forceinline__ int row_blocks(const int* rowPtr, int h, int Nb, int I, int& first) {
  first = 0;
  int count = I + 1;
  if (rowPtr != nullptr) {
    first = rowPtr[h * Nb + I];
    count = rowPtr[h * Nb + I + 1] - first;
  }
  return count;
}

// Stage the CTA's BM query rows (positions q0 ..; q holds positions off .. n − 1, rows
// outside read nothing and land as zeros) into shared memory in 16-byte chunks, at the
// address `at(row, chunk)` gives (each layout's own swizzle).
template <int BM, int D, int NT, class At>
__device__ __forceinline__ void stage_q(const u16* q, int q0, int n, int off, size_t qStride, int h, int tid, At at) {
  constexpr int CH = D / 8;
  for (int c = tid; c < BM * CH; c += NT) {
    const int r = c / CH, ch = c % CH, row = q0 + r;
    const bool ok = row < n && row >= off;
    const u16* src = q + (size_t)(ok ? row - off : 0) * qStride + (size_t)h * D + ch * 8;
    cp_async16(at(r, ch), src, ok ? 16 : 0);
  }
}

// Butterfly sum and max over a warp's 32 lanes (xor 16, 8, 4, 2, 1): every lane ends with
// the same value, added in the same order on every GPU.
template <class T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Sum of x over a CTA of NT threads (a multiple of 32; red holds NT / 32 words), returned to
// every thread. It starts with a barrier, so red may be reused from one call to the next.
template <int NT, class T>
__device__ __forceinline__ T cta_sum(T x, T* red) {
  x = warp_sum(x);
  __syncthreads();  // red may still be read from a previous call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  T s = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; w++) s += red[w];
  return s;
}

// Exclusive prefix sum of x over a CTA of NT threads in thread order (an inclusive scan in
// the warp, then the warps' totals); total gets the CTA's sum. red as in cta_sum (starts with
// a barrier).
template <int NT, class T>
__device__ __forceinline__ T cta_exclusive_sum(T x, T* red, T& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inc = x;
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  __syncthreads();  // earlier readers of red are done
  if (lane == 31) red[warp] = inc;
  __syncthreads();
  T run = inc - x, all = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; w++) {
    const T r = red[w];
    run += w < warp ? r : (T)0;
    all += r;
  }
  total = all;
  return run;
}

// Exclusive scan of in[0..N) into out[0..N], out[N] = total, by one CTA of 1024 threads
// (each thread a contiguous segment). Deterministic; fine for N up to a few million.
__device__ __forceinline__ void cta_exclusive_scan(const int* in, int* out, int N) {
  __shared__ int part[1024];
  const int t = threadIdx.x;
  const int seg = (N + 1023) / 1024;
  const int a = t * seg < N ? t * seg : N, e = a + seg < N ? a + seg : N;
  int s = 0;
  for (int i = a; i < e; i++) s += in[i];
  part[t] = s;
  __syncthreads();
  for (int off = 1; off < 1024; off <<= 1) {
    const int x = t >= off ? part[t - off] : 0;
    __syncthreads();
    part[t] += x;
    __syncthreads();
  }
  int run = part[t] - s;
  for (int i = a; i < e; i++) {
    const int c = in[i];
    out[i] = run;
    run += c;
  }
  if (t == 1023) out[N] = part[1023];
}
