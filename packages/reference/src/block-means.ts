/**
 * Block means of a head-major tensor: the pooled path's Q̄_I and K̄_J (FlexPrefill's pooled
 * estimate and the PE rows), for a whole tensor or for the rows of one shard of it.
 */

/** A head-major f64 tensor's layout (math.ts HeadMajor): data[(h * rows + r) * dim + c]. */
export interface HeadMajorRows {
  readonly rows: number;
  readonly heads: number;
  readonly dim: number;
  readonly data: Float64Array;
}

/** Per-block means [heads][Nb][dim] and the number of rows each block holds [Nb]. */
export interface BlockMeans {
  readonly mean: Float64Array;
  readonly count: Int32Array;
}

/**
 * Mean of each block's rows (a partial block over its real rows): [heads][Nb][dim]. Row r of
 * `x` sits at position firstPos + r; blocks holding none of its rows stay zero with count 0.
 * A block's mean depends only on its own rows, summed in row order, so a shard holding whole
 * blocks computes the same values as the whole tensor does.
 */
export function blockMeans(x: HeadMajorRows, B: number, firstPos: number, Nb: number): BlockMeans {
  const { rows, heads, dim } = x;
  const mean = new Float64Array(heads * Nb * dim);
  const count = new Int32Array(Nb);
  for (let r = 0; r < rows; r++) count[Math.floor((firstPos + r) / B)]++;
  for (let h = 0; h < heads; h++) {
    for (let r = 0; r < rows; r++) {
      const J = Math.floor((firstPos + r) / B);
      const src = (h * rows + r) * dim;
      const dst = (h * Nb + J) * dim;
      for (let c = 0; c < dim; c++) mean[dst + c] += x.data[src + c];
    }
    for (let J = 0; J < Nb; J++) {
      if (count[J] === 0) continue;
      const inv = 1 / count[J];
      const dst = (h * Nb + J) * dim;
      for (let c = 0; c < dim; c++) mean[dst + c] *= inv;
    }
  }
  return { mean, count };
}
