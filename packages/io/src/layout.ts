/**
 * Q/K/V file layouts and their mapping to the library's canonical layout.
 *
 * Shape legend: n sequence length (tokens), H heads, d head dim.
 * The library's canonical layout is [n, H, d] row-major: one "row" is one token's H·d
 * values. Files may store the same tensor as:
 *   'nhd'   [n, H, d]      (canonical; what FlashAttention-style kernels take)
 *   '1nhd'  [1, n, H, d]   (a batch of one, as many model dumps are)
 *   'hnd'   [H, n, d]      (head-major, e.g. a transposed PyTorch [B, H, n, d] dump
 *                           with B dropped); transposed to [n, H, d] while streaming
 * A rank-3 file cannot say whether it is [n, H, d] or [H, n, d], so the layout is
 * always given explicitly by the caller.
 */
import { InvalidArgumentError, ShapeError } from '@crisp/core';

export type Layout = 'nhd' | '1nhd' | 'hnd';
export const LAYOUTS: readonly Layout[] = ['nhd', '1nhd', 'hnd'];

const LAYOUT_ALIASES: Readonly<Record<string, Layout>> = {
  nhd: 'nhd',
  '[n,h,d]': 'nhd',
  'n,h,d': 'nhd',
  '1nhd': '1nhd',
  '[1,n,h,d]': '1nhd',
  '1,n,h,d': '1nhd',
  bnhd: '1nhd',
  hnd: 'hnd',
  '[h,n,d]': 'hnd',
  'h,n,d': 'hnd',
};

/** Accepts 'nhd' | '1nhd' | 'hnd' and the bracket spellings '[n,H,d]', '[1,n,H,d]', '[H,n,d]'. */
export function parseLayout(x: unknown): Layout {
  if (typeof x === 'string') {
    const key = x.replace(/\s+/g, '').toLowerCase();
    const hit = LAYOUT_ALIASES[key];
    if (hit !== undefined) return hit;
  }
  throw new InvalidArgumentError(
    `layout must be one of 'nhd' ([n,H,d]), '1nhd' ([1,n,H,d]) or 'hnd' ([H,n,d]); got ${JSON.stringify(x)}`,
  );
}

/** Sizes of a Q/K/V tensor in canonical terms. */
export interface QkvDims {
  readonly n: number;
  readonly H: number;
  readonly d: number;
}

function rankHint(shape: readonly number[]): string {
  if (shape.length === 4 && shape[0] === 1) return "pass layout '1nhd' for [1, n, H, d] files";
  if (shape.length === 4) {
    return `the leading (batch) dim is ${shape[0]}: only a batch of one is supported, save one batch element`;
  }
  if (shape.length === 3) return "pass layout 'nhd' for [n, H, d] or 'hnd' for [H, n, d] files";
  return 'Q/K/V must be stored as [n, H, d], [1, n, H, d] or [H, n, d]';
}

/** Reads n, H, d off a file shape under a layout; wrong rank or empty dims are ShapeErrors. */
export function dimsFromFileShape(shape: readonly number[], layout: Layout, what: string): QkvDims {
  const want = layout === '1nhd' ? 4 : 3;
  if (shape.length !== want) {
    throw new ShapeError(
      `${what} has shape [${shape.join(', ')}] (rank ${shape.length}) but layout '${layout}' means ${layoutShapeText(layout)} (rank ${want}); ${rankHint(shape)}`,
      { shape: [...shape], layout },
    );
  }
  if (layout === '1nhd' && shape[0] !== 1) {
    throw new ShapeError(
      `${what} has shape [${shape.join(', ')}]: layout '1nhd' needs a leading dim of 1; ${rankHint(shape)}`,
      { shape: [...shape], layout },
    );
  }
  const dims =
    layout === 'hnd'
      ? { n: shape[1], H: shape[0], d: shape[2] }
      : layout === 'nhd'
        ? { n: shape[0], H: shape[1], d: shape[2] }
        : { n: shape[1], H: shape[2], d: shape[3] };
  if (dims.n < 1 || dims.H < 1 || dims.d < 1) {
    throw new ShapeError(`${what} has shape [${shape.join(', ')}]: n, H and d must all be at least 1`, {
      shape: [...shape],
      layout,
    });
  }
  return dims;
}

/** The file shape a canonical [n, H, d] tensor takes under a layout. */
export function fileShapeFor(dims: QkvDims, layout: Layout): number[] {
  if (layout === 'hnd') return [dims.H, dims.n, dims.d];
  if (layout === '1nhd') return [1, dims.n, dims.H, dims.d];
  return [dims.n, dims.H, dims.d];
}

export function layoutShapeText(layout: Layout): string {
  return layout === 'hnd' ? '[H, n, d]' : layout === '1nhd' ? '[1, n, H, d]' : '[n, H, d]';
}
