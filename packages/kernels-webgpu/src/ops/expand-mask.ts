/**
 * expandMask: vertical/slash lists (and own block rows) expanded to block rows on the GPU
 * (count, scan, fill); sparseAttention uses the device-side form directly.
 */
import {
  assertBlockSize,
  type BlockMask,
  type BlockRows,
  LimitError,
  validateMask,
} from '@crisp/core';
import { expandCountProgram, expandFillProgram, scanProgram } from '../kernels/blocks.js';
import { type Check, Usage } from '../runtime/gpu-context.js';
import type { OpHost } from './host.js';
import { checkMaskArrays } from './validate.js';

/**
 * Rows an expansion may make: rowPtr [R + 1] u32 in one binding, and the count and fill grids
 * (256 rows a workgroup, 2-D) inside the workgroup limits. Checked before anything else, so a
 * mask with a huge numBlocks and empty lists costs nothing.
 */
function checkRows(host: OpHost, H: number, Nb: number): void {
  const R = H * Nb;
  const lim = host.gpu.limits;
  const maxRows = Math.min(Math.floor(lim.maxStorageBufferBindingSize / 4) - 1, 256 * lim.maxComputeWorkgroupsPerDimension ** 2);
  if (R > maxRows) {
    throw new LimitError(
      `the mask has ${H} heads x ${Nb} blocks = ${R} rows; this device's buffers hold at most ${maxRows} (maxStorageBufferBindingSize ${lim.maxStorageBufferBindingSize}). Use a larger block size or a shorter sequence`,
      { limit: 'maxStorageBufferBindingSize', max: maxRows, rows: R },
    );
  }
}

/** Expand on the GPU; rowPtr and cols stay in device buffers (the caller retires them). */
export async function expandOnDevice(host: OpHost, mask: BlockMask): Promise<{ rowPtr: GPUBuffer; cols: GPUBuffer; rows: number }> {
  const H = mask.heads;
  const Nb = mask.numBlocks;
  checkRows(host, H, Nb);
  const g = host.gpu;
  const vs = mask.vs;
  // Upper bound on the expanded size: a row holds at most I + 1 blocks and at most the
  // sum of its three sources.
  let cap = 0;
  for (let h = 0; h < H; h++) {
    const lists = vs ? vs.verticalPtr[h + 1] - vs.verticalPtr[h] + vs.slashPtr[h + 1] - vs.slashPtr[h] : 0;
    for (let I = 0; I < Nb; I++) {
      const r = h * Nb + I;
      const own = mask.rows ? mask.rows.rowPtr[r + 1] - mask.rows.rowPtr[r] : 0;
      cap += Math.min(I + 1, lists + own);
    }
  }
  const listLength = vs ? vs.vertical.length + vs.slash.length : 0;
  g.checkBindings('expanding the mask', {
    'expanded cols': Math.max(1, cap) * 4,
    'vertical and slash lists': listLength * 4,
    'input cols': (mask.rows?.cols.length ?? 0) * 4,
  });
  const vsPtr = new Uint32Array(2 * (H + 1));
  let sliceBase = 0;
  let list = new Uint32Array(0);
  if (vs) {
    vsPtr.set(vs.verticalPtr, 0);
    vsPtr.set(vs.slashPtr, H + 1);
    sliceBase = vs.vertical.length;
    list = new Uint32Array(listLength);
    list.set(vs.vertical, 0);
    list.set(vs.slash, sliceBase);
  }
  const temps: GPUBuffer[] = [];
  const checks: Check[] = [];
  let ptrB: GPUBuffer | undefined;
  let listB: GPUBuffer | undefined;
  try {
    g.scoped(checks, 'the mask lists', () => {
      ptrB = g.u32Buffer(vsPtr, 'vsPtr');
      temps.push(ptrB);
      listB = g.u32Buffer(list, 'vsList');
      temps.push(listB);
    });
    await g.settle(checks);
    return await expandBuffers(host, H, Nb, { vsPtr: ptrB!, vsList: listB!, sliceBase }, mask.rows, cap);
  } finally {
    g.retire(...temps);
  }
}

/**
 * Expand lists already on the device (vsPtr [vertical H + 1][slash H + 1], vsList with the
 * slash lists from sliceBase) and optional host rows into rows of at most `cap` blocks in all:
 * count, scan, fill, queued with nothing read back.
 */
export async function expandBuffers(
  host: OpHost,
  H: number,
  Nb: number,
  lists: { readonly vsPtr: GPUBuffer; readonly vsList: GPUBuffer; readonly sliceBase: number },
  rows: BlockRows | { readonly rowPtr: GPUBuffer; readonly cols: GPUBuffer } | undefined,
  cap: number,
): Promise<{ rowPtr: GPUBuffer; cols: GPUBuffer; rows: number }> {
  checkRows(host, H, Nb);
  const R = H * Nb;
  const g = host.gpu;
  // rows on the host (uploaded here), or already on the device (rowPtr over all H * Nb rows)
  const hostRows = rows && ArrayBuffer.isView(rows.rowPtr) ? (rows as BlockRows) : undefined;
  const deviceRows = rows && !hostRows ? (rows as { readonly rowPtr: GPUBuffer; readonly cols: GPUBuffer }) : undefined;
  g.checkBindings('expanding the mask', { 'expanded cols': Math.max(1, cap) * 4, 'input cols': (hostRows?.cols.length ?? 0) * 4 });
  const [pCount, pScan, pFill] = await Promise.all([
    g.pipeline(expandCountProgram()),
    g.pipeline(expandFillProgram()),
    g.pipeline(scanProgram()),
  ]).then(([c, f, s]) => [c, s, f] as const);
  const checks: Check[] = [];
  const temps: GPUBuffer[] = [];
  const made: GPUBuffer[] = [];
  try {
    const [outPtr, outCols] = g.scoped(checks, `the expanded mask (${R} rows, up to ${cap} blocks)`, () => {
      const keep = (b: GPUBuffer) => {
        temps.push(b);
        return b;
      };
      const rpB = deviceRows?.rowPtr ?? keep(g.u32Buffer(hostRows ? hostRows.rowPtr : [0], 'rowPtr.in'));
      const colsB = deviceRows?.cols ?? keep(g.u32Buffer(hostRows ? hostRows.cols : [0], 'cols.in'));
      const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
      const ptr = g.createBuffer((R + 1) * 4, S, 'rowPtr');
      made.push(ptr);
      const cols = g.createBuffer(Math.max(1, cap) * 4, S, 'cols');
      made.push(cols);
      const grid = g.grid(R);
      const u = keep(g.uniform([H, Nb, rows ? 1 : 0, lists.sliceBase, grid.rowWidth, 0, 0, 0]));
      const us = keep(g.uniform([R, 0, 0, 0]));
      const enc = g.device.createCommandEncoder();
      g.dispatch(enc, pCount, [u, lists.vsPtr, lists.vsList, rpB, colsB, ptr], grid.groups);
      g.dispatch(enc, pScan, [us, ptr], [1]);
      g.dispatch(enc, pFill, [u, lists.vsPtr, lists.vsList, rpB, colsB, ptr, cols], grid.groups);
      g.submit(enc, temps);
      return [ptr, cols] as const;
    });
    await g.settle(checks);
    return { rowPtr: outPtr, cols: outCols, rows: R };
  } catch (e) {
    g.retire(...temps, ...made);
    throw e;
  }
}

export async function expandMask(host: OpHost, mask: BlockMask): Promise<BlockRows> {
  host.alive();
  checkMaskArrays(mask);
  validateMask(mask);
  assertBlockSize(mask.blockSize, host.capabilities.blockSizes);
  const { rowPtr, cols, rows } = await expandOnDevice(host, mask);
  try {
    const ptr = new Int32Array(await host.gpu.read(rowPtr, 0, (rows + 1) * 4));
    const total = ptr[rows];
    const c = total > 0 ? new Int32Array(await host.gpu.read(cols, 0, total * 4)) : new Int32Array(0);
    return { rowPtr: ptr, cols: c };
  } finally {
    host.gpu.retire(rowPtr, cols);
  }
}
