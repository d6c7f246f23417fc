// Routing on the device, for routers with an exact device form (core's DeviceRouterRule),
// so that a plan's selection and PE kernels can be queued behind the proxy statistics with
// no read in between (planOnDevice):
//   cStruct:  head h goes to VS iff C_struct[h] >= tauProxy (@crisp/router's cStruct: the
//             same f64 comparison, so a NaN goes to PE there too; the host rejects
//             non-finite statistics once it reads them).
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
extern "C" __global__ void route_cstruct(const double* stats, int H, double tauProxy, double* statsCopy, int* out,
                                         int mode) {
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
    const bool vs = h < H && cStruct[h] >= tauProxy;
    const bool pe = h < H && !vs;
    if (h < H) out[h] = vs ? 1 : 0;
    const u32 m = __ballot_sync(0xffffffffu, pe);
    if (pe) list[1 + base + __popc(m & ((1u << lane) - 1u))] = h;
    base += __popc(m);
  }
  if (lane == 0) list[0] = base;
}
