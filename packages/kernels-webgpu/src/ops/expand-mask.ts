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
import { Usage } from '../runtime/gpu-context.js';
import type { OpHost } from './host.js';

/** Expand on the GPU; rowPtr and cols stay in device buffers (the caller destroys them). */
export async function expandOnDevice(host: OpHost, mask: BlockMask): Promise<{ rowPtr: GPUBuffer; cols: GPUBuffer; rows: number }> {
  const H = mask.heads;
  const Nb = mask.numBlocks;
  const R = H * Nb;
  const g = host.gpu;
  const vs = mask.vs;
  const vsPtr = new Uint32Array(2 * (H + 1));
  let sliceBase = 0;
  let list = new Uint32Array(0);
  if (vs) {
    vsPtr.set(vs.verticalPtr, 0);
    vsPtr.set(vs.slashPtr, H + 1);
    sliceBase = vs.vertical.length;
    list = new Uint32Array(vs.vertical.length + vs.slash.length);
    list.set(vs.vertical, 0);
    list.set(vs.slash, sliceBase);
  }
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
  if (cap * 4 > g.limits.maxStorageBufferBindingSize) {
    throw new LimitError(`the expanded mask (${cap} blocks) exceeds maxStorageBufferBindingSize`, {
      limit: 'maxStorageBufferBindingSize',
    });
  }
  const [pCount, pScan, pFill] = await Promise.all([
    g.pipeline(expandCountProgram()),
    g.pipeline(expandFillProgram()),
    g.pipeline(scanProgram()),
  ]).then(([c, f, s]) => [c, s, f] as const);
  const temps: GPUBuffer[] = [];
  const ptrB = g.u32Buffer(vsPtr, 'vsPtr');
  const listB = g.u32Buffer(list, 'vsList');
  const rpB = g.u32Buffer(mask.rows ? mask.rows.rowPtr : [0], 'rowPtr.in');
  const colsB = g.u32Buffer(mask.rows ? mask.rows.cols : [0], 'cols.in');
  temps.push(ptrB, listB, rpB, colsB);
  const S = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST;
  const outPtr = g.createBuffer((R + 1) * 4, S, 'rowPtr');
  const outCols = g.createBuffer(Math.max(1, cap) * 4, S, 'cols');
  const grid = g.grid(R);
  const u = g.uniform([H, Nb, mask.rows ? 1 : 0, sliceBase, grid.rowWidth, 0, 0, 0]);
  const us = g.uniform([R, 0, 0, 0]);
  temps.push(u, us);
  const enc = g.device.createCommandEncoder();
  g.dispatch(enc, pCount, [u, ptrB, listB, rpB, colsB, outPtr], grid.groups);
  g.dispatch(enc, pScan, [us, outPtr], [1]);
  g.dispatch(enc, pFill, [u, ptrB, listB, rpB, colsB, outPtr, outCols], grid.groups);
  g.submit(enc, temps);
  return { rowPtr: outPtr, cols: outCols, rows: R };
}

export async function expandMask(host: OpHost, mask: BlockMask): Promise<BlockRows> {
  host.alive();
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
