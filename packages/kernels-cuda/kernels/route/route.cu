// Routing on the device, for routers with a device form (core's DeviceRouterRule, reduced by
// deviceRouteTerms to two tests), so that a plan's selection and PE kernels can be queued
// behind the proxy statistics with no read in between (planOnDevice):
//   cStruct:     head h goes to PE iff !(C_struct[h] >= tauProxy) (@crisp/router's cStruct:
//                the same f64 comparison, so a NaN goes to PE there too; the host rejects
//                non-finite statistics once it reads them). tauProxy −inf: no such test.
//   residualJsd: head h goes to PE iff r = 1 − p_v[0] − p_v[Nb−1] >= minResidual and the
//                JS distance between the pooled estimate and p_v over blocks 1..Nb−2 (both
//                renormalised) is < tau (route_residual, core's residualDistance; the sums
//                in another order, so a distance within core's RESIDUAL_MARGIN of tau may
//                round the other way, which the host check allows).
//   jsd:         head h goes to PE iff the JS distance over every block is < tau
//                (FlexPrefill's router, core's jsDistance; route_residual with full = 1, the
//                same margin). It takes the residual test's place: a rule has one of the two.
// A head goes to PE when either test says so (anyPe).
//
// Output out [2H + 1] int: routes [H] (1 = VS, 0 = PE, as select.cu reads them), then the PE
// head list [nPE][PE heads ascending] that pe.cu, expand_count and expand_write (mask.cu)
// and the PE heads' attention read. The kernel also copies the statistics' head values
// [non-finite count][C_struct H][entropy H] (f64, proxyStats' layout) to statsCopy, beside the
// routes and the VS list pointers, so the plan's end reads them all in one copy.
#include "../common/crisp-common.cuh"

// One CTA of 32 threads: routes in parallel, the list compacted in head order by one warp
// ballot a round of 32 heads.
// mode: 1 routes, 2 the copy, 3 both. planOnDevice routes (1) on its second stream as soon as
// C_struct is there (proxy_cstruct) and copies (2) on the main stream once the rest of
// the statistics are.
// residual: [H] 1 where route_residual sends the head to PE (null: no residual test).
extern "C" __global__ void route_cstruct(const double* stats, int H, double tauProxy, double* statsCopy, int* out,
                                         int mode, const int* residual) {
  const int lane = threadIdx.x;
  const double* cStruct = stats + 1;
  if (mode & 2) {
    for (int i = lane; i < 1 + 2 * H; i += 32) statsCopy[i] = stats[i];
  }
  if (!(mode & 1)) return;
  int* list = out + H;
  int base = 0;
  for (int h0 = 0; h0 < H; h0 += 32) {
    const int h = h0 + lane;
    const bool vs = h < H && cStruct[h] >= tauProxy && !(residual != nullptr && residual[h] != 0);
    const bool pe = h < H && !vs;
    if (h < H) out[h] = vs ? 1 : 0;
    const u32 m = __ballot_sync(0xffffffffu, pe);
    if (pe) list[1 + base + __popc(m & ((1u << lane) - 1u))] = h;
    base += __popc(m);
  }
  if (lane == 0) list[0] = base;
}

#define RES_T 256

// x · ln(x / m) with 0 · ln 0 = 0 (core's klTerm).
__device__ __forceinline__ double res_kl(double x, double m) { return x > 0.0 ? x * log(x / m) : 0.0; }

// The residual test, one CTA of RES_T threads a head: pv and pooled [H][Nb] f64 (the
// statistics' p_v and pooled estimate); pe [H] gets 1 where the head goes to PE. As core's
// residualDistance: Nb < 3, no residual mass, a non-positive or negative-entry distribution:
// distance sqrt(ln 2) (VS). full: FlexPrefill's jsd router instead, the distance over every
// block (core's jsDistance) and no residual mass test; an undefined distance is VS here (the
// host router rejects such statistics).
extern "C" __global__ void __launch_bounds__(RES_T) route_residual(const double* pv, const double* pooled, int H, int Nb,
                                                                    double tau, double minResidual, int* pe, int full) {
  __shared__ double red[RES_T / 32];
  const int h = blockIdx.x, t = threadIdx.x;
  const double* p = pv + (size_t)h * Nb;
  const double* a = pooled + (size_t)h * Nb;
  const int lo = full ? 0 : 1, hi = full ? Nb : Nb - 1;
  if (!full) {
    if (Nb < 3) {
      if (t == 0) pe[h] = 0;
      return;
    }
    const double residual = 1.0 - p[0] - p[Nb - 1];
    // (the whole CTA takes the same branch: residual is one value)
    if (!(residual > 0.0) || !(residual >= minResidual)) {
      if (t == 0) pe[h] = 0;
      return;
    }
  }
  double sp = 0.0, sa = 0.0, neg = 0.0;
  for (int J = lo + t; J < hi; J += RES_T) {
    sp += p[J];
    sa += a[J];
    if (p[J] < 0.0 || a[J] < 0.0) neg = 1.0;
  }
  sp = cta_sum<RES_T>(sp, red);
  sa = cta_sum<RES_T>(sa, red);
  neg = cta_sum<RES_T>(neg, red);
  if (!(sp > 0.0) || !(sa > 0.0) || neg > 0.0) {
    if (t == 0) pe[h] = 0;
    return;
  }
  double kp = 0.0, ka = 0.0;
  for (int J = lo + t; J < hi; J += RES_T) {
    const double x = a[J] / sa, y = p[J] / sp, m = 0.5 * (x + y);
    kp += res_kl(x, m);
    ka += res_kl(y, m);
  }
  kp = cta_sum<RES_T>(kp, red);
  ka = cta_sum<RES_T>(ka, red);
  const double d = sqrt(fmax(0.0, 0.5 * kp + 0.5 * ka));
  // (a NaN distance is VS, as the host's)
  if (t == 0) pe[h] = d < tau ? 1 : 0;
}
