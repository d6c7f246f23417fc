/**
 * The mask a WebGPU device plan prepares (core's PreparedMask): the routes and VS lists the
 * device selected, expanded into rows on the device, with the PE heads' rows.
 *
 * Where every head's pooled map fits one binding (ops/pe-cut.ts), the PE heads' γ cut is
 * queued on the device with the selection: the mask is whole when planned, and nothing is
 * read back before the attention. Otherwise the cut runs on the host (peBlockRows), which
 * needs the routes there: the PE part is then made once, when first needed (`complete()`):
 * by sparsePrefill inside the plan's time, by sparseAttention before its attention run, by
 * the plan's read(), or by readBlockCounts(). Either way the rows equal peBlockRows' for the
 * routed PE heads, so the plan equals the host plan.
 */
import { type BlockRows, CrispError, InvalidArgumentError, type PreparedMask, type Route, spreadRowPtr, type VsLists } from '@crisp/core';
import { type QueuedSelection, readRowCounts, readSelection } from '../ops/device-select.js';
import { expandBuffers } from '../ops/expand-mask.js';
import type { OpHost } from '../ops/host.js';
import type { DevicePeRows } from '../ops/pe-cut.js';
import { peBlockRows } from '../ops/pe-rows.js';
import type { WebGpuTensor } from '../runtime/tensor.js';

/** What the PE heads' rows are made from (the plan request's `pe`). */
export interface PeInputs {
  readonly q: WebGpuTensor;
  readonly k: WebGpuTensor;
  readonly gamma: number;
  readonly scale: number | undefined;
}

/** Every head's rows (the VS lists ∪ the PE rows) on the device. */
interface FinalRows {
  readonly rowPtr: GPUBuffer;
  readonly cols: GPUBuffer;
}

/** The PE part the host made: every head's rows, and the PE heads' rows (peBlockRows' form) when there are PE heads. */
interface HostPart extends FinalRows {
  readonly peRows: BlockRows | undefined;
}

/**
 * How the device cut's columns come back: the whole buffer beside the row pointers (one trip
 * for the whole plan) when it is at most `wholeColsMaxBytes` (H · Nb(Nb + 1)/2 · 4 bytes: 4.2
 * MB at H = 32 and 32k keys in blocks of 128), else as many as the pointers say, a trip later.
 * A trip costs more than copying a few megabytes: on an H100, the plan's read going from about
 * eight trips to two took 5.4 ms off the time after the GPU's last kernel at 8k. Mutable for
 * tests.
 */
export const PLAN_READ = { wholeColsMaxBytes: 8 * 1024 * 1024 };

/** A prepared mask dropped unreleased gives its buffers back once collected. */
const PREPARED_FINALIZER = new FinalizationRegistry<{ gpu: OpHost['gpu']; held: GPUBuffer[] }>((h) => h.gpu.retire(...h.held));

export class WebGpuPreparedMask implements PreparedMask {
  readonly backend: string;
  readonly heads: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly #host: OpHost;
  readonly #sel: QueuedSelection;
  readonly #pe: PeInputs;
  readonly #held: GPUBuffer[];
  #hostPe: Promise<HostPart> | undefined;
  #counts: Promise<Float64Array> | undefined;
  #released = false;

  constructor(host: OpHost, shape: { readonly heads: number; readonly numBlocks: number; readonly blockSize: number }, sel: QueuedSelection, pe: PeInputs) {
    this.backend = host.name;
    this.#host = host;
    this.heads = shape.heads;
    this.numBlocks = shape.numBlocks;
    this.blockSize = shape.blockSize;
    this.#sel = sel;
    this.#pe = pe;
    this.#held = [...sel.held];
    PREPARED_FINALIZER.register(this, { gpu: host.gpu, held: this.#held }, this);
  }

  /** Whether `host` (a backend's) made this mask. */
  ownedBy(host: OpHost): boolean {
    return this.#host === host;
  }

  get released(): boolean {
    return this.#released;
  }

  /** the VS lists expanded (the PE heads' rows not in them), capacity in blocks */
  get vsRows(): { readonly rowPtr: GPUBuffer; readonly cols: GPUBuffer; readonly cap: number } {
    return this.#sel;
  }


  #alive(): void {
    this.#host.alive();
    if (this.#released) throw new InvalidArgumentError('the device plan was read after its prepared mask was released; read it first');
  }

  /**
   * Resolves once the whole mask is queued on the device: at once where the cut ran there;
   * else after the host made the PE part (the routes read back, peBlockRows, every head's
   * rows expanded again with them), once.
   */
  async complete(): Promise<void> {
    await this.rows();
  }

  /** every head's final rows on the device (complete() first) */
  async rows(): Promise<FinalRows> {
    this.#alive();
    // (the device cut's rows are in the selection's expansion)
    if (this.#sel.pe) return this.#sel;
    return this.#hostPart();
  }

  /** the PE part the host makes (where the cut is not on the device), made once */
  #hostPart(): Promise<HostPart> {
    this.#hostPe ??= this.#makeHostPe();
    return this.#hostPe;
  }

  async #makeHostPe(): Promise<HostPart> {
    const H = this.heads;
    const Nb = this.numBlocks;
    const sel = this.#sel;
    const routes = await this.#readRoutes();
    const peHeads = routes.flatMap((r, h) => (r === 'pe' ? [h] : []));
    if (peHeads.length === 0) {
      return { peRows: undefined, rowPtr: sel.rowPtr, cols: sel.cols };
    }
    const { q, k, gamma, scale } = this.#pe;
    const peRows = await peBlockRows(this.#host, q, k, { blockSize: this.blockSize, gamma, heads: peHeads, scale });
    this.#alive();
    const rows = { rowPtr: spreadRowPtr(peRows.rowPtr, peHeads, H, Nb), cols: peRows.cols };
    const e = await expandBuffers(this.#host, H, Nb, { vsPtr: sel.vsPtr, vsList: sel.vsList, sliceBase: H * Nb }, rows, sel.cap);
    if (this.#released) this.#host.gpu.retire(e.rowPtr, e.cols);
    else this.#held.push(e.rowPtr, e.cols);
    return { peRows, rowPtr: e.rowPtr, cols: e.cols };
  }

  async #readRoutes(): Promise<Route[]> {
    const ab = await this.#host.gpu.read(this.#sel.routes, 0, this.heads * 4);
    return Array.from(new Uint32Array(ab), (x): Route => (x === 1 ? 'vs' : 'pe'));
  }

  /**
   * The device cut's rows, read back into peBlockRows' form (the PE heads' rows only), from
   * its row pointers and columns: `colsRead` is the whole columns buffer read beside the
   * pointers where it is small (PLAN_READ), else the columns are read once the pointers say
   * how many there are.
   */
  async #readDevicePe(pe: DevicePeRows, routes: readonly Route[], ptrRead: Promise<ArrayBuffer>, colsRead: Promise<ArrayBuffer> | undefined): Promise<BlockRows | undefined> {
    const H = this.heads;
    const Nb = this.numBlocks;
    const peHeads = routes.flatMap((r, h) => (r === 'pe' ? [h] : []));
    const ptr = new Int32Array(await ptrRead);
    const whole = colsRead ? new Int32Array(await colsRead) : undefined;
    if (peHeads.length === 0) return undefined;
    const total = ptr[H * Nb];
    if (!(total >= 0 && total * 4 <= pe.cols.size)) {
      throw new CrispError('BACKEND_ERROR', `the device PE cut wrote ${total} columns, outside [0, ${pe.cols.size / 4}]`);
    }
    const all = whole ?? (total > 0 ? new Int32Array(await this.#host.gpu.read(pe.cols, 0, total * 4)) : new Int32Array(0));
    const rowPtr = new Int32Array(peHeads.length * Nb + 1);
    let len = 0;
    for (const h of peHeads) len += ptr[(h + 1) * Nb] - ptr[h * Nb];
    const cols = new Int32Array(len);
    let at = 0;
    peHeads.forEach((h, s) => {
      const a = ptr[h * Nb];
      const b = ptr[(h + 1) * Nb];
      cols.set(all.subarray(a, b), at);
      for (let I = 0; I < Nb; I++) rowPtr[s * Nb + I + 1] = at + ptr[h * Nb + I + 1] - a;
      at += b - a;
    });
    return { rowPtr, cols };
  }

  /**
   * The device's routes, VS lists and PE rows (the PE part made first when it is not yet).
   * With the cut on the device, the selection and the cut's rows come back in one trip (the
   * columns in a second where their buffer is over PLAN_READ's bound).
   */
  async read(): Promise<{ routes: Route[]; vs: VsLists; peRows: BlockRows | undefined }> {
    this.#alive();
    const devicePe = this.#sel.pe;
    if (!devicePe) {
      const made = await this.#hostPart();
      this.#alive();
      const { routes, vs } = await readSelection(this.#host, this.#sel, this.heads, this.numBlocks);
      return { routes, vs, peRows: made.peRows };
    }
    const g = this.#host.gpu;
    const selRead = readSelection(this.#host, this.#sel, this.heads, this.numBlocks);
    const ptrRead = g.read(devicePe.rowPtr, 0, (this.heads * this.numBlocks + 1) * 4);
    const colsRead = devicePe.cols.size <= PLAN_READ.wholeColsMaxBytes ? g.read(devicePe.cols, 0, devicePe.cols.size) : undefined;
    // (all are awaited below; a rejection of a later one while an earlier is awaited is not unhandled)
    ptrRead.catch(() => undefined);
    colsRead?.catch(() => undefined);
    const { routes, vs } = await selRead;
    const peRows = await this.#readDevicePe(devicePe, routes, ptrRead, colsRead);
    return { routes, vs, peRows };
  }

  /**
   * Blocks per head of the final rows; read once (the plan's read starts it beside its own,
   * so it shares their trip).
   */
  readBlockCounts(): Promise<Float64Array> {
    try {
      this.#alive();
    } catch (e) {
      return Promise.reject(e);
    }
    this.#counts ??= (async () => {
      const r = await this.rows();
      this.#alive();
      return readRowCounts(this.#host, r.rowPtr, this.heads, this.numBlocks);
    })();
    return this.#counts;
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    PREPARED_FINALIZER.unregister(this);
    // (destroyed once the work submitted so far, an attention on these rows included, is done)
    this.#host.gpu.retire(...this.#held);
  }
}
