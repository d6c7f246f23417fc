/**
 * The buffer a device plan (CudaBackend.planOnDevice) reads back in one copy, before the VS
 * list pointers: the statistics' head values [non-finite count][C_struct H][entropy H] (f64),
 * the routes [H] and the PE head list [count][heads] (int, route.cu), expand's summary [H + 2]
 * (each head's first row pointer, the total, the bad-row flag). Byte offsets; `bytes` is a
 * multiple of 8. Shared with the stand-in driver, which fills that copy in CPU tests.
 */
/** expand_count's bad-row flag while no row is bad (INT_MAX; CRISP_NO_BAD_ROW in crisp-common.cuh) */
export const NO_BAD_ROW = 0x7fffffff;

export function devicePlanLayout(H: number): { headBytes: number; sumOff: number; bytes: number } {
  const headBytes = 8 * (1 + 2 * H);
  const sumOff = headBytes + 4 * (2 * H + 1);
  return { headBytes, sumOff, bytes: Math.ceil((sumOff + 4 * (H + 2)) / 8) * 8 };
}
