import { type BlockMask, hostTensor, vsListsFromArrays } from '@crisp/core';
import { attentionRows, createReferenceBackend, massRecall, relativeError } from '@crisp/reference';

export async function referenceExample(seed = 1) {
  // q [n, H, d], k and v [n, Hkv, d]; two query heads per kv head (GQA); B = 64.
  const [n, H, Hkv, d, B] = [256, 4, 2, 64, 64];
  let s = seed;
  const uniform = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 2 - 1;
  const random = (shape: number[]) => hostTensor('f32', shape, Array.from({ length: shape[0] * shape[1] * shape[2] }, uniform));
  const [q, k, v] = [random([n, H, d]), random([n, Hkv, d]), random([n, Hkv, d])];

  const backend = createReferenceBackend();
  const [qd, kd, vd] = [backend.upload(q), backend.upload(k), backend.upload(v)];

  // Proxy statistics of the last B queries: C_struct, p_v, p_s (offset 0 = diagonal), ...
  const stats = await backend.proxyStats(qd, kd, { blockSize: B, wSink: 64, wLocal: 64 });

  // Every head: vertical key block 0 (the sink) and slash offset block 0 (the diagonal).
  const mask: BlockMask = {
    heads: H,
    numBlocks: n / B,
    blockSize: B,
    vs: vsListsFromArrays(Array(H).fill([0]), Array(H).fill([0])),
  };
  const sparse = await backend.sparseAttention(qd, kd, vd, mask, { returnLse: true });
  const dense = await backend.denseAttention(qd, kd, vd);

  const sparseOut = await backend.download(sparse.output); // a HostTensor [n, H, d]
  const error = relativeError(sparseOut, await backend.download(dense.output)); // per head and overall
  const recall = massRecall(q, k, mask); // dense attention mass inside the mask, sampled rows
  const lastRow = attentionRows(q, k, v, [n - 1], mask); // exact float64, one query row
  backend.dispose();
  return { cStruct: stats.cStruct, error, recall, lastRow, sparseOut };
}
