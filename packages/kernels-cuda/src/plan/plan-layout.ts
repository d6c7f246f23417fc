import { CrispError } from '@crisp/core';

/**
 * The buffer a device plan (planOnDevice, plan/device-plan.ts) reads back in one copy, before the VS
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

/** A device plan's expansion summary [headPtr H + 1][total][bad row]: a bad row is this backend's fault. */
export function assertGoodRows(summary: Int32Array, H: number, Nb: number): void {
  const badRow = summary[H + 1];
  if (badRow !== NO_BAD_ROW) {
    // the device builds every row itself
    throw new CrispError('BACKEND_ERROR', `the device plan built a bad row (head ${Math.floor(badRow / Nb)} row ${badRow % Nb}); the mask was not written`);
  }
}
