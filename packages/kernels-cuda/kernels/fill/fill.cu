// Input generators and checks for benchmarks and tests (not used by the attention path).
//
// crisp_hash(idx, seed) is a formula the PyTorch peer (apps/bench/peers/sdpa_peer.py)
// evaluates identically in int64, so both sides see bit-identical bf16/f16 inputs:
//   x = (idx * 2654435761 + seed) mod 2^32; then twice x = ((x >> 16) ^ x) * 0x45d9f3b mod 2^32;
//   x = (x >> 16) ^ x; value = ((x >> 8) * 2^-24 - 0.5) * 2 * amp, rounded to nearest even.
#include "../common/crisp-common.cuh"

__device__ __forceinline__ u32 crisp_hash(u64 idx, u32 seed) {
  u32 x = (u32)((idx * 2654435761ull + (u64)seed) & 0xffffffffull);
  x = (u32)((((u64)((x >> 16) ^ x)) * 0x45d9f3bull) & 0xffffffffull);
  x = (u32)((((u64)((x >> 16) ^ x)) * 0x45d9f3bull) & 0xffffffffull);
  return (x >> 16) ^ x;
}
__device__ __forceinline__ float hash_uniform(u64 idx, u32 seed, float amp) {
  const u32 x = crisp_hash(idx, seed);
  return (((float)(x >> 8)) * 5.9604644775390625e-08f - 0.5f) * 2.f * amp;
}

template <bool BF16>
__device__ __forceinline__ void fill_hash_body(u16* x, u64 count, u32 seed, float amp) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
    x[i] = from_f32<BF16>(hash_uniform(i, seed, amp));
}
extern "C" __global__ void fill_hash_bf16(u16* x, u64 count, u32 seed, float amp) { fill_hash_body<true>(x, count, seed, amp); }
extern "C" __global__ void fill_hash_f16(u16* x, u64 count, u32 seed, float amp) { fill_hash_body<false>(x, count, seed, amp); }

// A llama-like structured layer: noise plus, per head, a sink (the first 4 keys), a
// RoPE-like local window (dims 0..31: Σ_f cos(ω_f (i − j)) peaks at i = j), vertical lines
// (keys whose hash hits 1 in `vEvery`, dim 33) and one slash line at offset
// slash0 + 997 (h mod 5) (dims 34..47). Heads with h mod 4 == 3 get only noise and a weak
// local window: the diffuse heads a router should send to PE.
// which: 0 = q [n, H, D], 1 = k [n, Hkv, D], 2 = v [n, Hkv, D].
template <bool BF16>
__device__ __forceinline__ void fill_llama_body(u16* x, int which, int n, int heads, int D, int H, u32 seed,
                                                int slash0, int vEvery) {
  const u64 count = (u64)n * heads * D;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {
    const int d = (int)(i % D);
    const int hh = (int)((i / D) % heads);
    const int pos = (int)(i / ((u64)D * heads));
    float val = hash_uniform(i, seed + (u32)which * 7919u, 1.f);
    if (which == 2) {
      x[i] = from_f32<BF16>(val);
      continue;
    }
    const int hq = which == 0 ? hh : hh * (H / heads);  // a representative query head for kv heads
    const bool diffuse = which == 0 ? (hh % 4 == 3) : false;
    if (d < 32) {
      const int f = d >> 1;
      const float w = __powf(10000.f, -(float)f / 16.f);
      const float A = diffuse ? 1.2f : 2.65f;
      const float ang = w * (float)pos;
      val = A * ((d & 1) ? __sinf(ang) : __cosf(ang));
    } else if (d == 32) {
      if (which == 0) val = diffuse ? 0.f : 4.f;
      else val = pos < 4 ? 40.f : 0.f;
    } else if (d == 33) {
      if (which == 0) val = diffuse ? 0.f : 4.f;
      else val = (crisp_hash((u64)pos, seed ^ 0xabcdu) % (u32)vEvery) == 0 ? 22.f : 0.f;
    } else if (d < 48) {
      const int f = (d - 34) >> 1;
      const float w = __powf(10000.f, -(float)f / 7.f);
      const int off = slash0 + 997 * (hq % 5);
      const float ang = w * (float)(which == 0 ? pos - off : pos);
      const float A = (which == 0 && diffuse) ? 0.f : 3.f;
      val = A * ((d & 1) ? __sinf(ang) : __cosf(ang));
    }
    x[i] = from_f32<BF16>(val);
  }
}
extern "C" __global__ void fill_llama_bf16(u16* x, int which, int n, int heads, int D, int H, u32 seed, int slash0,
                                           int vEvery) {
  fill_llama_body<true>(x, which, n, heads, D, H, seed, slash0, vEvery);
}
extern "C" __global__ void fill_llama_f16(u16* x, int which, int n, int heads, int D, int H, u32 seed, int slash0,
                                          int vEvery) {
  fill_llama_body<false>(x, which, n, heads, D, H, seed, slash0, vEvery);
}

// Partial sums for ‖a − b‖² and ‖b‖² (f64) and the count of non-finite values in a, per
// CTA (256 threads); the host adds the partials. part [grid][3].
template <bool BF16>
__device__ __forceinline__ void rel_err_body(const u16* a, const u16* b, u64 count, double* part) {
  __shared__ double s0[256], s1[256], s2[256];
  double e = 0.0, r = 0.0, bad = 0.0;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {
    const float x = to_f32<BF16>(a[i]), y = to_f32<BF16>(b[i]);
    if ((__float_as_uint(x) & 0x7f800000u) == 0x7f800000u) {  // NaN or Inf
      bad += 1.0;
      continue;
    }
    const double dd = (double)x - (double)y;
    e += dd * dd;
    r += (double)y * (double)y;
  }
  s0[threadIdx.x] = e;
  s1[threadIdx.x] = r;
  s2[threadIdx.x] = bad;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      s0[threadIdx.x] += s0[threadIdx.x + w];
      s1[threadIdx.x] += s1[threadIdx.x + w];
      s2[threadIdx.x] += s2[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    part[blockIdx.x * 3] = s0[0];
    part[blockIdx.x * 3 + 1] = s1[0];
    part[blockIdx.x * 3 + 2] = s2[0];
  }
}
extern "C" __global__ void rel_err_bf16(const u16* a, const u16* b, u64 count, double* part) { rel_err_body<true>(a, b, count, part); }
extern "C" __global__ void rel_err_f16(const u16* a, const u16* b, u64 count, double* part) { rel_err_body<false>(a, b, count, part); }

// A device-side wait of `ns` nanoseconds (one thread, on the global timer): benchmarks queue it
// before a timed call so the host has queued the whole call before the device reaches it, which
// separates the device's own critical path from time the device spends waiting for the host.
extern "C" __global__ void spin_ns(u64 ns) {
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
