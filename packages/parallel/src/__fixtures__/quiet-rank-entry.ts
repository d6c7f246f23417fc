// A rank's entry whose fn returns nothing, rank 0 at once and the others later, so rank 0's
// thread has exited before the last rank reports.
import { serveRank } from '../node.js';

serveRank(async (comm) => {
  if (comm.rank > 0) await new Promise((resolve) => setTimeout(resolve, 300));
});
