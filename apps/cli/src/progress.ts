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
