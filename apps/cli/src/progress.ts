/**
 * Progress on stderr (cli-progress) for long steps, only when stderr is a terminal: logs
 * and pipes get no bar noise, and --json keeps stdout clean either way.
 */
import cliProgress from 'cli-progress';
import type { OutStream } from './cli-io.js';

export interface Progress {
  update(done: number): void;
  stop(): void;
}

const silent: Progress = { update() {}, stop() {} };

export function progressBar(stderr: OutStream, label: string, total: number): Progress {
  if (!stderr.isTTY || total <= 0) return silent;
  const bar = new cliProgress.SingleBar(
    {
      stream: stderr as unknown as NodeJS.WritableStream,
      format: `${label.padEnd(24)} [{bar}] {percentage}% | {value}/{total} | {duration_formatted}`,
      hideCursor: true,
      clearOnComplete: true,
      fps: 10,
    },
    cliProgress.Presets.shades_classic,
  );
  bar.start(total, 0);
  return {
    update: (done) => bar.update(done),
    stop: () => bar.stop(),
  };
}

/** Runs an async step with a spinner-less "label ... done (ms)" line on terminals. */
export async function step<T>(stderr: OutStream, label: string, fn: () => Promise<T>): Promise<T> {
  const t0 = performance.now();
  if (stderr.isTTY) stderr.write(`${label} ...`);
  try {
    return await fn();
  } finally {
    if (stderr.isTTY) stderr.write(` ${(performance.now() - t0).toFixed(0)} ms\n`);
  }
}
