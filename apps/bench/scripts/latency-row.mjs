// One crisp-bench result's first latency row, unrounded, for the H200 scripts' summaries:
//   node apps/bench/scripts/latency-row.mjs OUT/bench.json
// prints the medians (total, plan with its share, attention, and the plan's phases when the
// run split them) and, when the row has them, each timed run's plan, total and GC pauses
// (planRuns). Exits 1 when the file or the row is missing.
import { readFileSync } from 'node:fs';

const file = process.argv[2];
let row;
try {
  row = JSON.parse(readFileSync(file, 'utf8')).suites?.latency?.rows?.[0];
} catch {
  row = undefined;
}
if (!row) {
  console.log(`  (no latency row in ${file})`);
  process.exit(1);
}
const f3 = (x) => x.toFixed(3);
const ph = row.planPhases;
console.log(
  `  median total ${f3(row.ms.median)} ms, plan ${f3(row.planMs)} ms (${((100 * row.planMs) / row.ms.median).toFixed(2)}%), attention ${f3(row.attentionMs)} ms${ph ? `, statistics ${f3(ph.statsMs)}, after them ${f3(ph.peRowsMs)}` : ''}`,
);
const runs = row.planRuns;
if (runs) {
  const list = (v) => v.map((x) => x.toFixed(2)).join(' ');
  console.log(`  plan  ${list(runs.planMs)}`);
  if (runs.totalMs) console.log(`  total ${list(runs.totalMs)}`);
  console.log(`  gc    ${runs.gcMs ? list(runs.gcMs) : 'none'}`);
}
