// Dense and block-sparse causal flash attention on Hopper's warpgroup MMA (sm_90a only).
//
// Same contract as attention.cu (shapes, BSR rows, chunked prefill, lse; see there), other
// machinery: one CTA per (head, query block I) of B = 64 · NWG rows, NWG warpgroups of 128
// threads, each owning 64 query rows. S = Q Kᵀ and O += P V run as wgmma.mma_async
// m64nNk16 (f32 accumulators): Q and K are read by the tensor cores straight from shared
// memory through matrix descriptors; P (the softmax numerators, bf16/f16) goes from
// registers, V from shared memory as an N-major ("transposed") operand. Keys stream in tiles
// of BN = B rows (one mask block per tile), three stages deep, loaded by a producer warpgroup
// (wgw_body below): with cp.async by its 128 threads (wgw), or with TMA by one thread (wgt). Softmax is FA2-style online in fp32 registers: the accumulator fragment of
// m64nNk16 is, per warp, the mma.sync m16n8 fragment repeated along N, so the masking,
// row max, exp2 (scale folded into one FFMA) and the rescale skip are those of attention.cu.
//
// Shared memory layout (what the 128-byte swizzle mode of the descriptors expects): every
// tile is stored as panels of 64 head-dim columns (128 bytes a row); in a panel, row r sits
// at r · 128 bytes and its 16-byte chunk c at chunk c ^ (r & 7); panels are 1024-byte aligned.
//   K-major operands (Q as A, K as B): SBO = 1024 (the next 8 rows), LBO unused; a 16-column
//   k-step inside a panel is +32 bytes on the start address, the next panel +rows · 128.
//   N-major operand (V as B, N = head dim): SBO = 1024 (the next 8 keys), LBO = the panel
//   stride (the next 64 head-dim columns); a 16-key k-step is +16 · 128 bytes.
// Reading from shared memory through the async proxy: cp.async writes are made visible with
// fence.proxy.async.shared::cta before the barrier that precedes the MMAs (TMA writes through
// the async proxy already).
//
// Built only for sm_90a (NVRTC --gpu-architecture=sm_90a): elsewhere (the sm_80/sm_90 compile
// checks) the kernels are empty stubs, which the backend never launches (it falls back to
// w32 off Hopper); an empty stub leaves the poisoned output visible to a self-check instead
// of trapping, which would kill the whole CUDA context.
#include "../common/crisp-common.cuh"

#include "../common/wgmma.cuh"

// A CUtensorMap (cuda.h, which NVRTC builds do not include): 128 opaque bytes, 64-byte aligned,
// encoded on the host by cuTensorMapEncodeTiled and passed by value as a __grid_constant__
// kernel parameter.
struct __align__(64) TmaDesc {
  unsigned long long bits[16];
};

#ifdef CRISP_WGMMA

// One key tile's online-softmax step on the S fragment (FA2; the paper's m, ℓ): causal
// mask where the tile reaches past the warp's first row, new running max (raw scores; the
// scale is applied inside one FFMA per score), s ← exp2(s · scale − m), ℓ ← ℓ · c + Σ s.
// Returns the correction factors c = exp2(m_old − m_new) for the O rows A and B.
// MASK: -1 masks where needMask says, in one code path (the compiler then emits a compare
// and a select for every score of every tile, a fifth of a tile's instructions at d = 64);
// 0 never masks, 1 always does, so a caller that branches on needMask runs the mask's code
// only on the tiles that cross the diagonal.
template <int BN, int MASK = -1>
__device__ __forceinline__ void online_softmax(float* s, int ks, bool needMask, int rA, int rB, int lane,
                                               float scaleLog2, float& mA, float& mB, float& lA, float& lB,
                                               float& cA, float& cB) {
  float mxA = CRISP_NEG_INF, mxB = CRISP_NEG_INF;
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int col = ks + j * 8 + (lane & 3) * 2 + e;
      if (MASK < 0 ? needMask : MASK == 1) {
        if (col > rA) s[j * 4 + e] = CRISP_NEG_INF;
        if (col > rB) s[j * 4 + 2 + e] = CRISP_NEG_INF;
      }
      mxA = fmaxf(mxA, s[j * 4 + e]);
      mxB = fmaxf(mxB, s[j * 4 + 2 + e]);
    }
  }
  mxA = quad_max(mxA) * scaleLog2;
  mxB = quad_max(mxB) * scaleLog2;
  const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
  // A row with no visible key yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
  const float uA = nA == CRISP_NEG_INF ? 0.f : nA, uB = nB == CRISP_NEG_INF ? 0.f : nB;
  cA = exp2f(mA - uA);
  cB = exp2f(mB - uB);
  mA = nA;
  mB = nB;
  float sumA = 0.f, sumB = 0.f;
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    s[j * 4 + 0] = exp2f(fmaf(s[j * 4 + 0], scaleLog2, -uA));
    s[j * 4 + 1] = exp2f(fmaf(s[j * 4 + 1], scaleLog2, -uA));
    s[j * 4 + 2] = exp2f(fmaf(s[j * 4 + 2], scaleLog2, -uB));
    s[j * 4 + 3] = exp2f(fmaf(s[j * 4 + 3], scaleLog2, -uB));
    sumA += s[j * 4 + 0] + s[j * 4 + 1];
    sumB += s[j * 4 + 2] + s[j * 4 + 3];
  }
  lA = lA * cA + sumA;
  lB = lB * cB + sumB;
}
// O rows A and B times their correction factors (skipped by the caller when the whole warp
// has c = 1: most tiles of a long row, once its max has settled).
template <int D>
__device__ __forceinline__ void rescale(float* acc, float cA, float cB) {
#pragma unroll
  for (int j = 0; j < D / 8; j++) {
    acc[j * 4 + 0] *= cA;
    acc[j * 4 + 1] *= cA;
    acc[j * 4 + 2] *= cB;
    acc[j * 4 + 3] *= cB;
  }
}
// P (the exp2 numerators, fp32 S fragment) as wgmma A fragments: per 16 keys the mma.sync
// m16n8k16 A layout (rows A/B, keys 0-7 and 8-15 of the step).
template <int BN, bool BF16>
__device__ __forceinline__ void pack_p(u32 (&p)[BN / 16][4], const float* s) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++) {
    p[kk][0] = pack2<BF16>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
    p[kk][1] = pack2<BF16>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
    p[kk][2] = pack2<BF16>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
    p[kk][3] = pack2<BF16>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
  }
}
template <int D, int BN, bool BF16>
__device__ __forceinline__ void issue_pv(float* acc, const u32 (&p)[BN / 16][4], u32 vBase) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++) wgmma_rs<D, BF16>(acc, p[kk], gmma_desc(vBase + kk * 16 * 128, BN * 128, 1024), 1);
}

// O / ℓ to bf16/f16 rows A and B (positions; rows outside [off, n) are not written) and
// lse = (m + log2 ℓ) · ln 2 when asked (row stride lseStride: m, or the packed Mq of a varlen batch).
template <int D, bool BF16>
__device__ __forceinline__ void store_rows(u16* __restrict__ o, float* __restrict__ lse, const float* acc, float mA,
                                           float mB, float lA, float lB, int rA, int rB, int lane, int n,
                                           size_t lseStride, int off, int h, size_t qStride) {
  const float la = quad_sum(lA), lb = quad_sum(lB);
  const float iA = la > 0.f ? 1.f / la : 0.f, iB = lb > 0.f ? 1.f / lb : 0.f;
#pragma unroll
  for (int j = 0; j < D / 8; j++) {
    const int col = j * 8 + (lane & 3) * 2;
    if (rA < n && rA >= off)
      *reinterpret_cast<u32*>(o + (size_t)(rA - off) * qStride + (size_t)h * D + col) =
          pack2<BF16>(acc[j * 4 + 0] * iA, acc[j * 4 + 1] * iA);
    if (rB < n && rB >= off)
      *reinterpret_cast<u32*>(o + (size_t)(rB - off) * qStride + (size_t)h * D + col) =
          pack2<BF16>(acc[j * 4 + 2] * iB, acc[j * 4 + 3] * iB);
  }
  if (lse != nullptr && (lane & 3) == 0) {
    const float ln2 = 0.6931471805599453f;
    if (rA < n && rA >= off) lse[(size_t)h * lseStride + (rA - off)] = la > 0.f ? (mA + log2f(la)) * ln2 : CRISP_NEG_INF;
    if (rB < n && rB >= off) lse[(size_t)h * lseStride + (rB - off)] = lb > 0.f ? (mB + log2f(lb)) * ln2 : CRISP_NEG_INF;
  }
}

// mbarrier (shared::cta) helpers for the warp-specialised layout: arrive (release), and a
// spin on try_wait.parity (acquire) for the phase with the given parity.
__device__ __forceinline__ void mbar_init(u32 addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 addr) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ bool mbar_try(u32 addr, int parity) {
  u32 ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(addr), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(u32 addr, int parity) {
  while (!mbar_try(addr, parity)) {
  }
}
// The producer's arrival on a full mbarrier, announcing `bytes` of TMA writes to wait for.
__device__ __forceinline__ void mbar_expect_tx(u32 addr, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
}
// One TMA box (64 head-dim columns × B rows of one kv head) from the tensor map at `map` (a
// kernel parameter's address) to shared memory at dst, completing on the mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* map, int c0, int c1, int c2, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// wgw: the consumers issue S_t = Q K_tᵀ and the previous tile's O += P_{t-1} V_{t-1} back to
// back, so the softmax of one tile runs under the other's MMAs (FA3's intra-warpgroup
// overlap), fed by a producer warpgroup instead of a CTA-wide barrier per tile (FA3's warp specialisation, with cp.async where FA3 uses TMA). Warpgroups
// 0 .. NWG − 1 consume, warpgroup NWG produces; at NWG 2 the producer hands registers to the
// consumers (setmaxnreg 40 / 232: 384 threads would otherwise get 168 each, and the consumer
// schedule needs ~218). ST stages of K and of V; per stage a "full" mbarrier (128 producer
// arrivals, after the threads' cp.async landed and were fenced to the async proxy) and an
// "empty" one (every consumer thread arrives once the MMAs that read the stage are complete). The producer signals tile t − 1 before it may block on an
// empty stage for tile t, so with ST >= 2 the chain cannot deadlock. The two
// consumer warpgroups no longer meet at a barrier each tile, so one's softmax can run under
// the other's MMAs.
// PP (wgt, NWG 2): FA3's ping-pong on top. The two consumer warpgroups take turns to issue
// their MMAs through two named barriers (2 and 3): warpgroup w waits on barrier 2 + w, issues
// its S_t and P_{t-1}V_{t-1}, then arrives on the other's barrier, so one warpgroup's MMAs run
// while the other does its softmax. Each warpgroup issues nTiles + 1 times (the first S, the
// loop, the last P·V), warpgroup 1 arrives first once so that warpgroup 0 starts; its last
// arrival is never waited on (named barriers do not outlive the CTA). Measured on an H100 it
// is neither a gain nor a loss beyond the run-to-run spread (PERFORMANCE.md); TMA is the gain.
// TMA (wgt): the producer is one thread issuing tensor-memory-accelerator copies of K and V
// (cp.async.bulk.tensor, tensor maps tmK / tmV over the [rows, Hkv, D] key and value tensors,
// boxes of 64 head-dim columns × B keys written in the 128-byte swizzle the descriptors read),
// so no producer thread computes addresses or issues per-chunk copies; each full mbarrier
// waits for one arrival and the tile's bytes. Keys past the tensor's rows read as zeros.
// MSPLIT (wgt): the softmax is built with and without the causal mask and each tile branches
// to one (online_softmax's MASK), so the mask costs nothing on the tiles below the diagonal;
// in one path it was a fifth of a tile's instructions at d = 64 (PERFORMANCE.md).
template <int D, int NWG, bool BF16, int ST, bool PP = false, bool TMA = false, bool MSPLIT = false, int BNT = 0>
__device__ __forceinline__ void wgw_body(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                                        u16* __restrict__ o, float* __restrict__ lse, const int* __restrict__ rowPtr,
                                        const int* __restrict__ cols, int n, int m, int Nb, int H, int Hkv,
                                        float scaleLog2, const int* hsel, int hmode, size_t lseStride,
                                        const TmaDesc* tmK = nullptr, const TmaDesc* tmV = nullptr, int kRow0 = 0) {
  constexpr int BM = 64 * NWG;
  // key tile: the query tile's rows, or BNT (wg3: 128-key tiles under 192-row query tiles, dense only)
  constexpr int BN = BNT ? BNT : BM;
  constexpr int NC = NWG * 128;  // consumer threads
  constexpr int CH = D / 8;
  constexpr u32 QBYTES = BM * D * 2, TBYTES = BN * D * 2;
  extern __shared__ __align__(1024) unsigned char smem[];
  const u32 sQ = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 sK = sQ + QBYTES;
  const u32 sV = sK + ST * TBYTES;
  const u32 bars = sV + ST * TBYTES;
  auto fullK = [&](int st) -> u32 { return bars + 8u * st; };
  auto fullV = [&](int st) -> u32 { return bars + 8u * (ST + st); };
  auto emptyK = [&](int st) -> u32 { return bars + 8u * (2 * ST + st); };
  auto emptyV = [&](int st) -> u32 { return bars + 8u * (3 * ST + st); };

  const int off = n - m;
  int h, I;
  if (!cta_order(Nb, hsel, hmode, h, I)) return;
  const int kvh = h / (H / Hkv);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int q0 = I * BM;
  const size_t qStride = (size_t)H * D, kStride = (size_t)Hkv * D;
  int first;
  int nTiles = row_blocks(rowPtr, h, Nb, I, first);
  // dense with BN != BM: the key tiles up to the query tile's last row (Nb counts query tiles)
  if (BN != BM && rowPtr == nullptr) nTiles = ((q0 + BM < n ? q0 + BM : n) + BN - 1) / BN;
  auto tileStart = [&](int t) -> int { return (rowPtr != nullptr ? cols[first + t] : t) * BN; };

  if (tid == 0) {
    for (int st = 0; st < ST; st++) {
      mbar_init(fullK(st), TMA ? 1 : 128);
      mbar_init(fullV(st), TMA ? 1 : 128);
      mbar_init(emptyK(st), NC);
      mbar_init(emptyV(st), NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= NWG * 4) {
    if (NWG == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (NWG == 3) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (TMA) {
      if (tid != NC) return;
      tma_prefetch(tmK);
      tma_prefetch(tmV);
      // one thread: per tile, K then V, each when its stage is free; a tile's bytes are
      // counted by its full mbarrier (arrive.expect_tx), so the consumers wait for the data itself
      for (int t = 0; t < nTiles; t++) {
        const int st = t % ST, par = ((t / ST) & 1) ^ 1, row = kRow0 + tileStart(t);
        mbar_wait(emptyK(st), par);
        mbar_expect_tx(fullK(st), TBYTES);
#pragma unroll
        for (int pn = 0; pn < D / 64; pn++) tma_load_3d(sK + st * TBYTES + pn * BN * 128, tmK, pn * 64, kvh, row, fullK(st));
        mbar_wait(emptyV(st), par);
        mbar_expect_tx(fullV(st), TBYTES);
#pragma unroll
        for (int pn = 0; pn < D / 64; pn++) tma_load_3d(sV + st * TBYTES + pn * BN * 128, tmV, pn * 64, kvh, row, fullV(st));
      }
      return;
    }
    // Producer: K_t then V_t into stage t % ST, each when its stage is free; the tile before
    // is signalled in between (its groups are the older ones: wait_group 1).
    const int ptid = tid - NC;
    auto issue = [&](const u16* src, u32 dst, int t) {
      const int ks = tileStart(t);
      for (int c = ptid; c < BN * CH; c += 128) {
        const int r = c / CH, ch = c % CH, key = ks + r;
        const size_t go = (size_t)(key < n ? key : n - 1) * kStride + (size_t)kvh * D + ch * 8;
        cp_async16(dst + pswz(BN, r, ch), src + go, key < n ? 16 : 0);
      }
      cp_async_commit();
    };
    auto signal = [&](int t) {
      fence_proxy_async();
      mbar_arrive(fullK(t % ST));
      mbar_arrive(fullV(t % ST));
    };
    for (int t = 0; t < nTiles; t++) {
      const int st = t % ST, par = ((t / ST) & 1) ^ 1;
      mbar_wait(emptyK(st), par);
      issue(k, sK + st * TBYTES, t);
      if (t > 0) {
        cp_async_wait<1>();
        signal(t - 1);
      }
      mbar_wait(emptyV(st), par);
      issue(v, sV + st * TBYTES, t);
    }
    cp_async_wait<0>();
    if (nTiles > 0) signal(nTiles - 1);
    return;
  }

  if (NWG == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  if (NWG == 3) asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
  const int wg = warp >> 2, wq = warp & 3;
  for (int c = tid; c < BM * CH; c += NC) {
    const int r = c / CH, ch = c % CH, row = q0 + r;
    const bool ok = row < n && row >= off;
    const u16* src = q + (size_t)(ok ? row - off : 0) * qStride + (size_t)h * D + ch * 8;
    cp_async16(sQ + pswz(BM, r, ch), src, ok ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  asm volatile("bar.sync 1, %0;\n" ::"n"(NC) : "memory");  // the consumers only

  float acc[D / 2];
  float s[BN / 2];
  u32 p[BN / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; i++) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < BN / 2; i++) s[i] = 0.f;
#pragma unroll
  for (int i = 0; i < BN / 16; i++) p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0u;
  float mA = CRISP_NEG_INF, mB = CRISP_NEG_INF, lA = 0.f, lB = 0.f;
  const int rA = q0 + wg * 64 + wq * 16 + (lane >> 2), rB = rA + 8;
  const u32 qBase = sQ + wg * 64 * 128;
  constexpr bool PING = PP && NWG == 2;
  auto turnWait = [&]() {
    if (PING) asm volatile("bar.sync %0, 256;\n" ::"r"(2 + wg) : "memory");
  };
  auto turnPass = [&]() {
    if (PING) asm volatile("bar.arrive %0, 256;\n" ::"r"(3 - wg) : "memory");
  };
  if (PING && wg == 1 && nTiles > 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  auto softmaxS = [&](int t, float& cA, float& cB) {
    const int ks = tileStart(t);
    const bool needMask = ks + BN - 1 > q0 + wg * 64 + wq * 16;
    if (!MSPLIT)
      online_softmax<BN>(s, ks, needMask, rA, rB, lane, scaleLog2, mA, mB, lA, lB, cA, cB);
    else if (needMask)
      online_softmax<BN, 1>(s, ks, true, rA, rB, lane, scaleLog2, mA, mB, lA, lB, cA, cB);
    else
      online_softmax<BN, 0>(s, ks, false, rA, rB, lane, scaleLog2, mA, mB, lA, lB, cA, cB);
  };

  if (nTiles > 0) {
    mbar_wait(fullK(0), 0);
    reg_fence<BN / 2>(s);
    turnWait();
    wgmma_fence();
    issue_s<D, BN, BM, BF16>(s, qBase, sK);
    wgmma_commit();
    turnPass();
    wgmma_wait0();
    reg_fence<BN / 2>(s);
    mbar_arrive(emptyK(0));
    float cA, cB;
    softmaxS(0, cA, cB);
    pack_p<BN, BF16>(p, s);
  }
  for (int t = 1; t < nTiles; t++) {
    const int sk = t % ST, sv = (t - 1) % ST;
    mbar_wait(fullK(sk), (t / ST) & 1);
    mbar_wait(fullV(sv), ((t - 1) / ST) & 1);
    reg_fence<BN / 2>(s);
    reg_fence<D / 2>(acc);
    reg_fence_u<BN / 16>(p);
    turnWait();
    wgmma_fence();
    issue_s<D, BN, BM, BF16>(s, qBase, sK + sk * TBYTES);
    wgmma_commit();
    issue_pv<D, BN, BF16>(acc, p, sV + sv * TBYTES);
    wgmma_commit();
    turnPass();
    wgmma_wait1();
    reg_fence<BN / 2>(s);
    mbar_arrive(emptyK(sk));
    float cA, cB;
    softmaxS(t, cA, cB);
    wgmma_wait0();
    reg_fence<D / 2>(acc);
    reg_fence_u<BN / 16>(p);
    mbar_arrive(emptyV(sv));
    if (__any_sync(0xffffffffu, cA != 1.f || cB != 1.f)) rescale<D>(acc, cA, cB);
    pack_p<BN, BF16>(p, s);
  }
  if (nTiles > 0) {
    const int sv = (nTiles - 1) % ST;
    mbar_wait(fullV(sv), ((nTiles - 1) / ST) & 1);
    reg_fence<D / 2>(acc);
    reg_fence_u<BN / 16>(p);
    turnWait();
    wgmma_fence();
    issue_pv<D, BN, BF16>(acc, p, sV + sv * TBYTES);
    wgmma_commit();
    turnPass();
    wgmma_wait0();
    reg_fence<D / 2>(acc);
  }
  store_rows<D, BF16>(o, lse, acc, mA, mB, lA, lB, rA, rB, lane, n, lseStride, off, h, qStride);
}
#endif  // CRISP_WGMMA

// One extern "C" entry per (layout, dtype, d, B); the body is a template instance passed as
// the variadic tail (its commas would split an ordinary macro argument). Off sm_90a the
// entries are empty stubs (see the top of the file).
#ifdef CRISP_WGMMA
#define CRISP_HOPPER_CALL(D, ...)                                                                          \
  if (!varlen_segment<D>(segs, q, k, v, o, lse, rowPtr, cols, n, m, Nb, H, Hkv)) return;                 \
  __VA_ARGS__(q, k, v, o, lse, rowPtr, cols, n, m, Nb, H, Hkv, scaleLog2, hsel, hmode, (size_t)lseStride);
#else
#define CRISP_HOPPER_CALL(D, ...)
#endif
#define CRISP_ATTN_HOPPER(NAME, THREADS, D, ...)                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                \
      NAME(const u16* q, const u16* k, const u16* v, u16* o, float* lse, const int* rowPtr, const int* cols, \
           int n, int m, int Nb, int H, int Hkv, float scaleLog2, const int* hsel, int hmode,               \
           const VarSeg* segs, int lseStride) {                                                             \
    CRISP_HOPPER_CALL(D, __VA_ARGS__)                                                                        \
  }
// wgw: NWG consumer warpgroups plus a producer warpgroup; 3 stages of K and of V (224 KB of
// shared memory at B 128, d 128).
#define CRISP_ATTN_WGW(NAME, D, NWG, BF16) CRISP_ATTN_HOPPER(NAME, NWG * 128 + 128, D, wgw_body<D, NWG, BF16, 3>)
// wgt: wgw's schedule with the consumers in ping-pong, K and V loaded by TMA and the mask
// split (MSPLIT): two
// tensor-map parameters after the common ones (the key and value maps; a varlen launch's maps
// span the packed rows, and a sequence's first row is its segment's kRow).
#ifdef CRISP_WGMMA
#define CRISP_TMA_CALL(D, ...)                                                                                \
  const int kRow0 = segs != nullptr ? (int)segs[blockIdx.z].kRow : 0;                                        \
  if (!varlen_segment<D>(segs, q, k, v, o, lse, rowPtr, cols, n, m, Nb, H, Hkv)) return;                    \
  __VA_ARGS__(q, k, v, o, lse, rowPtr, cols, n, m, Nb, H, Hkv, scaleLog2, hsel, hmode, (size_t)lseStride, &tmK, \
              &tmV, kRow0);
#else
#define CRISP_TMA_CALL(D, ...)
#endif
// A TMA entry: THREADS per CTA, the body (a wgw_body instance) as the variadic tail.
#define CRISP_ATTN_TMA(NAME, THREADS, D, ...)                                                               \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                  \
      NAME(const u16* q, const u16* k, const u16* v, u16* o, float* lse, const int* rowPtr, const int* cols,  \
           int n, int m, int Nb, int H, int Hkv, float scaleLog2, const int* hsel, int hmode,                 \
           const VarSeg* segs, int lseStride, const __grid_constant__ TmaDesc tmK,                            \
           const __grid_constant__ TmaDesc tmV) {                                                             \
    CRISP_TMA_CALL(D, __VA_ARGS__)                                                                            \
  }
#define CRISP_ATTN_WGT(NAME, D, NWG, BF16) \
  CRISP_ATTN_TMA(NAME, NWG * 128 + 128, D, wgw_body<D, NWG, BF16, 3, true, true, true>)

CRISP_ATTN_WGW(attn_wgw_bf16_d64_b64, 64, 1, true)
CRISP_ATTN_WGW(attn_wgw_bf16_d64_b128, 64, 2, true)
CRISP_ATTN_WGW(attn_wgw_bf16_d128_b64, 128, 1, true)
CRISP_ATTN_WGW(attn_wgw_bf16_d128_b128, 128, 2, true)
CRISP_ATTN_WGW(attn_wgw_f16_d64_b64, 64, 1, false)
CRISP_ATTN_WGW(attn_wgw_f16_d64_b128, 64, 2, false)
CRISP_ATTN_WGW(attn_wgw_f16_d128_b64, 128, 1, false)
CRISP_ATTN_WGW(attn_wgw_f16_d128_b128, 128, 2, false)
CRISP_ATTN_WGT(attn_wgt_bf16_d64_b64, 64, 1, true)
CRISP_ATTN_WGT(attn_wgt_bf16_d64_b128, 64, 2, true)
CRISP_ATTN_WGT(attn_wgt_bf16_d128_b64, 128, 1, true)
CRISP_ATTN_WGT(attn_wgt_bf16_d128_b128, 128, 2, true)
CRISP_ATTN_WGT(attn_wgt_f16_d64_b64, 64, 1, false)
CRISP_ATTN_WGT(attn_wgt_f16_d64_b128, 64, 2, false)
CRISP_ATTN_WGT(attn_wgt_f16_d128_b64, 128, 1, false)
CRISP_ATTN_WGT(attn_wgt_f16_d128_b128, 128, 2, false)
// wg3 (d 64, dense only): wgt's TMA producer and mask split with three consumer warpgroups of
// 64 rows (192-row query tiles) over 128-key tiles, no ping-pong: more softmax in flight
// beside the products, where d = 64 makes the two about equally long. Nb is the number of
// 192-row query tiles; the launch covers dense causal rows only (no BSR rows, no varlen).
#define CRISP_ATTN_WG3(NAME, BF16) CRISP_ATTN_TMA(NAME, 512, 64, wgw_body<64, 3, BF16, 3, false, true, true, 128>)
CRISP_ATTN_WG3(attn_wg3_bf16_d64_b128, true)
CRISP_ATTN_WG3(attn_wg3_f16_d64_b128, false)
