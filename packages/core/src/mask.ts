/**
 * Block masks are data. One type holds both forms DESIGN.md names, per head:
 *
 *  - the vertical-slash form: sorted key blocks J (vertical; activates (I, J) for every
 *    query block I >= J) and sorted offset blocks O (slash; activates (I, I - O) for every
 *    I >= O), as MInference's kernels take them;
 *  - the block-sparse-row form (SciPy BSR meaning): for head h and query block I the row
 *    r = h * Nb + I holds sorted key blocks cols[rowPtr[r] .. rowPtr[r+1]).
 *
 * A head's selected set is the union of its VS part and its BSR row part; either may be
 * empty. Slash offsets index by distance from the diagonal: O = 0 is the diagonal block
 * (FlexPrefill stores them reversed; we do not). A token diagonal whose offset is not a
 * multiple of B straddles two block diagonals; like FlexPrefill we keep only (I, I - O).
 *
 * Shape legend: H heads, Nb = ceil(n / B) blocks.
 */
import { MaskError, describeValue } from './errors.js';
import { sortedUnique } from './ranking.js';

export interface VsLists {
  /** [H + 1] start of each head's vertical list in `vertical` */
  readonly verticalPtr: Int32Array;
  readonly vertical: Int32Array;
  /** [H + 1] start of each head's slash list in `slash` */
  readonly slashPtr: Int32Array;
  readonly slash: Int32Array;
}

export interface BlockRows {
  /** [H * Nb + 1] */
  readonly rowPtr: Int32Array;
  readonly cols: Int32Array;
}

export interface BlockMask {
  readonly heads: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly vs?: VsLists;
  readonly rows?: BlockRows;
}

/**
 * All-heads rowPtr [H·Nb + 1] for rows built for a subset of heads (ascending; the other
 * heads empty). The cols stay as they are: the listed heads keep their order and the
 * others add nothing, so a backend's cols array serves the all-heads rows unchanged.
 */
export function spreadRowPtr(sub: Int32Array, heads: readonly number[], H: number, Nb: number): Int32Array {
  if (!(sub instanceof Int32Array) || !Array.isArray(heads) || !Number.isInteger(H) || H < 1 || !Number.isInteger(Nb) || Nb < 1) {
    throw new MaskError('spreadRowPtr needs an Int32Array rowPtr, an array of head indices and positive integer H and Nb');
  }
  if (sub.length !== heads.length * Nb + 1) {
    throw new MaskError(`rowPtr for ${heads.length} heads must have ${heads.length * Nb + 1} entries; got ${sub.length}`);
  }
  const rowPtr = new Int32Array(H * Nb + 1);
  let s = 0;
  for (let h = 0; h < H; h++) {
    const base = h * Nb;
    if (s < heads.length && heads[s] === h) {
      rowPtr.set(sub.subarray(s * Nb + 1, (s + 1) * Nb + 1), base + 1);
      s++;
    } else {
      rowPtr.fill(rowPtr[base], base + 1, base + Nb + 1);
    }
  }
  if (s !== heads.length) throw new MaskError(`heads must be ascending indices in [0, ${H}); got ${heads.join(',')}`);
  return rowPtr;
}

/** Number of causal blocks of one head: Nb (Nb + 1) / 2. */
export function causalBlockCount(Nb: number): number {
  return (Nb * (Nb + 1)) / 2;
}

function checkSortedRange(arr: ArrayLike<number>, from: number, to: number, lo: number, hi: number, what: string): void {
  let prev = -1;
  for (let i = from; i < to; i++) {
    const x = arr[i];
    if (!Number.isInteger(x) || x < lo || x > hi) {
      throw new MaskError(`${what}: block index ${x} is outside [${lo}, ${hi}]`, { position: i });
    }
    if (x <= prev) throw new MaskError(`${what}: indices must be strictly increasing (${prev} then ${x})`);
    prev = x;
  }
}

function checkPtr(ptr: Int32Array, count: number, total: number, what: string): void {
  if (!(ptr instanceof Int32Array) || ptr.length !== count + 1) {
    throw new MaskError(`${what} must be an Int32Array of length ${count + 1}; got ${describeValue(ptr)}`);
  }
  if (ptr[0] !== 0 || ptr[count] !== total) {
    throw new MaskError(`${what} must start at 0 and end at ${total}; got ${ptr[0]} .. ${ptr[count]}`);
  }
  for (let i = 0; i < count; i++) {
    if (ptr[i + 1] < ptr[i]) throw new MaskError(`${what} must be non-decreasing (entry ${i})`);
  }
}

export interface ValidateMaskOptions {
  /**
   * Check every BSR entry (sorted, in range, causal). Default true. A backend that checks
   * the entries on the device while expanding the mask passes false: rowPtr is still
   * checked here, so the device never reads outside `cols`.
   */
  readonly rowEntries?: boolean;
  /**
   * Check that every query block selects at least one key block (default true): a query
   * block with none would have nothing to attend to, and its output rows would be zeros
   * with no error. What every backend's sparseAttention and expandMask require; the
   * counting and expansion helpers on the host (expandToRows, selectedBlockCounts,
   * maskDensity) pass false.
   */
  readonly coverage?: boolean;
  /**
   * Query blocks before this one hold no query rows (chunked prefill: q holds the last m of n
   * positions, so the first query block is floor((n − m) / B)); their rows may be empty.
   * Default 0.
   */
  readonly firstQueryBlock?: number;
}

const MAX_BLOCKS = 2 ** 31 - 1;

/**
 * Validate a mask: ranges, sorting, causality (cols <= row's query block), and that every
 * query block keeps at least one key block (`opts.coverage`).
 *
 * Coverage. Query block I of a head is covered by the head's VS part iff some vertical J or
 * slash offset O is <= I, i.e. iff I >= min(V ∪ S); so the VS part covers every block iff it
 * holds vertical 0 or slash offset 0, and the blocks below min(V ∪ S) need a non-empty BSR
 * row. Checked in O(H + blocks below the VS minimum), from rowPtr alone.
 */
export function validateMask(
  mask: BlockMask,
  expect?: { heads?: number; numBlocks?: number; blockSize?: number },
  opts: ValidateMaskOptions = {},
): void {
  if (!mask || typeof mask !== 'object') throw new MaskError(`mask must be a BlockMask object; got ${describeValue(mask)}`);
  const { heads: H, numBlocks: Nb } = mask;
  if (!Number.isInteger(H) || H < 1 || !Number.isInteger(Nb) || Nb < 1 || H * Nb >= MAX_BLOCKS) {
    throw new MaskError(`mask needs positive integer heads and numBlocks (heads · numBlocks < 2^31); got ${describeValue(H)}, ${describeValue(Nb)}`);
  }
  if (mask.blockSize !== undefined && !(Number.isInteger(mask.blockSize) && mask.blockSize > 0)) {
    throw new MaskError(`mask block size must be a positive integer; got ${describeValue(mask.blockSize)}`);
  }
  if (opts === null || typeof opts !== 'object') throw new MaskError('validateMask options must be an object');
  if (expect?.heads !== undefined && expect.heads !== H) {
    throw new MaskError(`mask covers ${H} heads but the problem has ${expect.heads}`);
  }
  if (expect?.numBlocks !== undefined && expect.numBlocks !== Nb) {
    throw new MaskError(`mask covers ${Nb} blocks but the problem has ${expect.numBlocks}`);
  }
  if (expect?.blockSize !== undefined && expect.blockSize !== mask.blockSize) {
    throw new MaskError(`mask block size ${mask.blockSize} differs from the problem's ${expect.blockSize}`);
  }
  if (!mask.vs && !mask.rows) throw new MaskError('mask has neither a vertical-slash part nor block rows');
  if (mask.vs) {
    if (typeof mask.vs !== 'object') throw new MaskError(`mask.vs must be VsLists; got ${describeValue(mask.vs)}`);
    const { verticalPtr, vertical, slashPtr, slash } = mask.vs;
    if (!(vertical instanceof Int32Array) || !(slash instanceof Int32Array)) {
      throw new MaskError('vs.vertical and vs.slash must be Int32Arrays (build them with vsListsFromArrays)');
    }
    checkPtr(verticalPtr, H, vertical.length, 'vs.verticalPtr');
    checkPtr(slashPtr, H, slash.length, 'vs.slashPtr');
    for (let h = 0; h < H; h++) {
      checkSortedRange(vertical, verticalPtr[h], verticalPtr[h + 1], 0, Nb - 1, `head ${h} vertical`);
      checkSortedRange(slash, slashPtr[h], slashPtr[h + 1], 0, Nb - 1, `head ${h} slash`);
    }
  }
  if (mask.rows) {
    if (typeof mask.rows !== 'object') throw new MaskError(`mask.rows must be BlockRows; got ${describeValue(mask.rows)}`);
    const { rowPtr, cols } = mask.rows;
    if (!(cols instanceof Int32Array)) throw new MaskError('rows.cols must be an Int32Array');
    checkPtr(rowPtr, H * Nb, cols.length, 'rows.rowPtr');
    if (opts.rowEntries !== false) {
      for (let r = 0; r < H * Nb; r++) {
        const I = r % Nb;
        checkSortedRange(cols, rowPtr[r], rowPtr[r + 1], 0, I, `head ${Math.floor(r / Nb)} row ${I} (causal: cols <= ${I})`);
      }
    }
  }
  if (opts.coverage !== false) checkCoverage(mask, opts.firstQueryBlock ?? 0);
}

/** Every query block from `first` on selects some key block (see validateMask); the mask's structure is checked. */
function checkCoverage(mask: BlockMask, first: number): void {
  const { heads: H, numBlocks: Nb, vs, rows } = mask;
  if (!Number.isInteger(first) || first < 0) throw new MaskError(`firstQueryBlock must be a non-negative integer; got ${describeValue(first)}`);
  for (let h = 0; h < H; h++) {
    // the VS part covers the query blocks from min(V ∪ S) on
    let lo = Nb;
    if (vs) {
      if (vs.verticalPtr[h + 1] > vs.verticalPtr[h]) lo = Math.min(lo, vs.vertical[vs.verticalPtr[h]]);
      if (vs.slashPtr[h + 1] > vs.slashPtr[h]) lo = Math.min(lo, vs.slash[vs.slashPtr[h]]);
    }
    for (let I = first; I < lo; I++) {
      const r = h * Nb + I;
      if (rows && rows.rowPtr[r + 1] > rows.rowPtr[r]) continue;
      throw new MaskError(
        `head ${h}: query block ${I} selects no key block (its attention would be empty and its output zeros); keep key block 0 in the vertical list or offset 0 (the diagonal) in the slash list, or give the row a block`,
        { head: h, queryBlock: I },
      );
    }
  }
}

/**
 * Throws MaskError unless `list` is an array or typed array of integer block indices in
 * [0, 2^31): checked on the values themselves, before any Int32Array copy could truncate a
 * fraction, wrap a large index or turn NaN into 0.
 */
export function assertIndexList(list: unknown, what: string, numBlocks = MAX_BLOCKS): asserts list is ArrayLike<number> {
  const typed = ArrayBuffer.isView(list) && !(list instanceof DataView) && !(list instanceof BigInt64Array) && !(list instanceof BigUint64Array);
  if (!typed && !Array.isArray(list)) {
    throw new MaskError(`${what} must be an array or Int32Array of block indices; got ${describeValue(list)}`);
  }
  const a = list as ArrayLike<unknown>;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (typeof x !== 'number' || !Number.isInteger(x) || x < 0 || x >= numBlocks) {
      throw new MaskError(
        `${what}[${i}] is ${describeValue(x)}; block indices must be integers in [0, ${numBlocks - 1}]${numBlocks < MAX_BLOCKS ? ` (Nb = ${numBlocks})` : ''}`,
        { position: i },
      );
    }
  }
}

/**
 * Build VS lists from per-head arrays (sorted and deduplicated here). Every entry must be an
 * integer block index >= 0 (MaskError otherwise; the range against Nb is validateMask's).
 */
export function vsListsFromArrays(vertical: ArrayLike<number>[], slash: ArrayLike<number>[]): VsLists {
  if (!Array.isArray(vertical) || !Array.isArray(slash) || vertical.length !== slash.length) {
    throw new MaskError(
      `vsListsFromArrays needs two arrays with one list per head, of the same length; got ${describeValue(vertical)} and ${describeValue(slash)}`,
    );
  }
  for (let h = 0; h < vertical.length; h++) {
    assertIndexList(vertical[h], `head ${h} vertical`);
    assertIndexList(slash[h], `head ${h} slash`);
  }
  return packVsLists(vertical, slash);
}

/** vsListsFromArrays without the checks, for lists already checked (the pipeline's selections; not exported from the package). */
export function packVsLists(vertical: ArrayLike<number>[], slash: ArrayLike<number>[]): VsLists {
  const pack = (lists: ArrayLike<number>[]) => {
    const ptr = new Int32Array(lists.length + 1);
    const sorted = lists.map((l) => sortedUnique(l));
    for (let h = 0; h < lists.length; h++) ptr[h + 1] = ptr[h] + sorted[h].length;
    const flat = new Int32Array(ptr[lists.length]);
    for (let h = 0; h < sorted.length; h++) flat.set(sorted[h], ptr[h]);
    return { ptr, flat };
  };
  const v = pack(vertical);
  const s = pack(slash);
  return { verticalPtr: v.ptr, vertical: v.flat, slashPtr: s.ptr, slash: s.flat };
}

/** Per-head view of a VS list: [vertical, slash]. */
export function vsHead(vs: VsLists, h: number): { vertical: Int32Array; slash: Int32Array } {
  return {
    vertical: vs.vertical.subarray(vs.verticalPtr[h], vs.verticalPtr[h + 1]),
    slash: vs.slash.subarray(vs.slashPtr[h], vs.slashPtr[h + 1]),
  };
}

/**
 * Expand any mask to pure block rows (the union of its parts, sorted). O(H * Nb * k):
 * the host reference of the backends' VS-to-rows primitive. The mask is validated first
 * (MaskError), except for coverage: rows it leaves empty stay empty.
 */
export function expandToRows(mask: BlockMask): BlockRows {
  validateMask(mask, undefined, { coverage: false });
  return expandValidated(mask);
}

/** expandToRows on a mask validateMask accepted (not exported from the package). */
export function expandValidated(mask: BlockMask): BlockRows {
  const { heads: H, numBlocks: Nb } = mask;
  const rowPtr = new Int32Array(H * Nb + 1);
  const chunks: Int32Array[] = [];
  const mark = new Int32Array(Nb).fill(-1);
  const scratch = new Int32Array(Nb);
  let total = 0;
  for (let h = 0; h < H; h++) {
    const v = mask.vs ? vsHead(mask.vs, h) : undefined;
    for (let I = 0; I < Nb; I++) {
      const r = h * Nb + I;
      let c = 0;
      const add = (J: number) => {
        if (mark[J] !== r) {
          mark[J] = r;
          scratch[c++] = J;
        }
      };
      if (v) {
        for (const J of v.vertical) {
          if (J > I) break;
          add(J);
        }
        for (const O of v.slash) {
          if (O > I) break;
          add(I - O);
        }
      }
      if (mask.rows) {
        const { rowPtr: rp, cols } = mask.rows;
        for (let p = rp[r]; p < rp[r + 1]; p++) add(cols[p]);
      }
      const row = scratch.slice(0, c).sort();
      chunks.push(row);
      total += c;
      rowPtr[r + 1] = total;
    }
  }
  const cols = new Int32Array(total);
  let off = 0;
  for (const ch of chunks) {
    cols.set(ch, off);
    off += ch.length;
  }
  return { rowPtr, cols };
}

/** Selected causal blocks per head, from expanded rows. */
export function blocksPerHead(rows: BlockRows, heads: number, Nb: number): Int32Array {
  const out = new Int32Array(heads);
  for (let h = 0; h < heads; h++) out[h] = rows.rowPtr[(h + 1) * Nb] - rows.rowPtr[h * Nb];
  return out;
}

/**
 * Selected causal blocks per head, counted without expanding the mask: O(|V| log |S|) per
 * head for the VS part plus one pass over the BSR entries. (Expanding a 512k mask to rows
 * on the host costs seconds; this costs milliseconds.)
 *
 * VS part: vertical J covers Nb - J blocks, slash O covers Nb - O blocks, and the pair
 * (J, O) hits the same block (J + O, J) when J + O <= Nb - 1, so it is counted once.
 * Rows part: an entry (I, J) adds a block unless J is vertical or I - J is a slash offset.
 * The mask is validated first (MaskError), except for coverage.
 */
export function selectedBlockCounts(mask: BlockMask): Float64Array {
  validateMask(mask, undefined, { coverage: false });
  return countValidated(mask);
}

/** selectedBlockCounts on a mask validateMask accepted: the host plan counts its own, just checked (not exported from the package). */
export function countValidated(mask: BlockMask): Float64Array {
  const { heads: H, numBlocks: Nb } = mask;
  const counts = new Float64Array(H);
  const vBit = new Uint8Array(Nb);
  const sBit = new Uint8Array(Nb);
  for (let h = 0; h < H; h++) {
    let c = 0;
    let vertical: Int32Array = new Int32Array(0);
    let slash: Int32Array = new Int32Array(0);
    if (mask.vs) ({ vertical, slash } = vsHead(mask.vs, h));
    for (const J of vertical) c += Nb - J;
    for (const O of slash) c += Nb - O;
    // Overlaps: for each J, the slash offsets O <= Nb - 1 - J (slash is sorted ascending,
    // and the bound shrinks as J grows, so one pointer walks down).
    let p = slash.length;
    for (const J of vertical) {
      while (p > 0 && slash[p - 1] > Nb - 1 - J) p--;
      c -= p;
    }
    if (mask.rows) {
      const { rowPtr, cols } = mask.rows;
      const entries = rowPtr[(h + 1) * Nb] - rowPtr[h * Nb];
      const vsLen = vertical.length + slash.length;
      if (vsLen === 0) {
        c += entries;
      } else if (vsLen * 16 < entries / Nb) {
        // Few VS blocks against long rows (PE heads: kMin best lines + rows near dense):
        // count each row's entries, minus those a VS block already covers, found by
        // binary search in the sorted row: O(Nb · |V ∪ S| · log row) instead of O(entries).
        c += entries;
        const nv = vertical.length;
        const ns = slash.length;
        for (let I = 0; I < Nb; I++) {
          const r = h * Nb + I;
          const a = rowPtr[r];
          const b = rowPtr[r + 1];
          if (a === b) continue;
          for (let x = 0; x < nv + ns; x++) {
            let J: number;
            if (x < nv) {
              J = vertical[x];
              if (J > I) {
                x = nv - 1; // on to the slash part
                continue;
              }
            } else {
              const O = slash[x - nv];
              if (O > I) break;
              J = I - O;
              // a block both vertical and slash was subtracted once in the vertical part
              if (sortedHas(vertical, 0, nv, J)) continue;
            }
            if (sortedHas(cols, a, b, J)) c--;
          }
        }
      } else {
        for (const J of vertical) vBit[J] = 1;
        for (const O of slash) sBit[O] = 1;
        for (let I = 0; I < Nb; I++) {
          const r = h * Nb + I;
          for (let q = rowPtr[r]; q < rowPtr[r + 1]; q++) {
            const J = cols[q];
            if (vBit[J] === 0 && sBit[I - J] === 0) c++;
          }
        }
        for (const J of vertical) vBit[J] = 0;
        for (const O of slash) sBit[O] = 0;
      }
    }
    counts[h] = c;
  }
  return counts;
}

/** Whether sorted arr[from, to) holds x (binary search). */
function sortedHas(arr: Int32Array, from: number, to: number, x: number): boolean {
  let lo = from;
  let hi = to;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (arr[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo < to && arr[lo] === x;
}

/**
 * Density per head: selected causal blocks / (Nb (Nb + 1) / 2). FlexPrefill divides by
 * Nb^2 instead; multiply by (Nb + 1) / (2 Nb) to compare.
 */
export function maskDensity(mask: BlockMask): { perHead: Float64Array; overall: number } {
  return densityFromCounts(selectedBlockCounts(mask), mask.numBlocks);
}

/** Density from selected causal blocks per head (however they were counted: host or device). */
export function densityFromCounts(counts: Float64Array, Nb: number): { perHead: Float64Array; overall: number } {
  const denom = causalBlockCount(Nb);
  const perHead = Float64Array.from(counts, (c) => c / denom);
  let s = 0;
  for (const c of counts) s += c;
  return { perHead, overall: s / (denom * counts.length) };
}

/** The dense causal mask as rows (every (I, J <= I)). */
export function denseRows(heads: number, Nb: number): BlockRows {
  const rowPtr = new Int32Array(heads * Nb + 1);
  const per = causalBlockCount(Nb);
  const cols = new Int32Array(heads * per);
  let p = 0;
  for (let h = 0; h < heads; h++) {
    for (let I = 0; I < Nb; I++) {
      for (let J = 0; J <= I; J++) cols[p++] = J;
      rowPtr[h * Nb + I + 1] = p;
    }
  }
  return { rowPtr, cols };
}
