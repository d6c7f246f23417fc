/**
 * Progress on stderr (cli-progress) for long steps, only when stderr is a terminal: logs
 * and pipes get no bar noise, and --json keeps stdout clean either way (bars never touch
 * stdout).
 */
import cliProgress from 'cli-progress';
import type { OutStream } from './cli-io.js';

export interface Progress {
  update(done: number): void;
  stop(): void;
}

const silent: Progress = { update() {}, stop() {} };

function bar(stderr: OutStream, format: string): cliProgress.SingleBar {
  return new cliProgress.SingleBar(
    {
      stream: stderr as unknown as NodeJS.WritableStream,
      format,
      hideCursor: true,
      clearOnComplete: true,
      fps: 10,
      etaBuffer: 20,
    },
    cliProgress.Presets.shades_classic,
  );
}

export function progressBar(stderr: OutStream, label: string, total: number): Progress {
  if (!stderr.isTTY || total <= 0) return silent;
  const b = bar(stderr, `${label.padEnd(24)} [{bar}] {percentage}% | {value}/{total} | {duration_formatted} | ETA {eta_formatted}`);
  b.start(total, 0);
  return {
    update: (done) => b.update(done),
    stop: () => b.stop(),
  };
}

/** Steps of a pass bar: each pass is this many, so the bar moves inside one. */
const STEPS = 1000;

export interface PassProgress {
  /** pass `index` (0-based) is `fraction` (0..1) done */
  at(index: number, fraction: number): void;
  stop(): void;
}

/**
 * A bar over `passes` whole passes (warm-up and timed runs) that also moves inside a pass,
 * when the backend says how far it has got (the reference backend does), with an ETA.
 */
export function passBar(stderr: OutStream, label: string, passes: number): PassProgress {
  if (!stderr.isTTY || passes <= 0) return { at() {}, stop() {} };
  const b = bar(stderr, `${label.padEnd(24)} [{bar}] {percentage}% | pass {pass}/{passes} | {duration_formatted} | ETA {eta_formatted}`);
  b.start(passes * STEPS, 0, { pass: 1, passes });
  return {
    at: (index, fraction) => {
      const f = Math.min(1, Math.max(0, fraction));
      b.update(Math.round((index + f) * STEPS), { pass: Math.min(passes, index + 1), passes });
    },
    stop: () => b.stop(),
  };
}
