/**
 * Where the command writes: stdout for results (only JSON under --json), stderr for
 * progress, notes and errors. Injectable so tests can run main() and read both.
 */
export interface OutStream {
  write(s: string): unknown;
  readonly isTTY?: boolean;
  readonly columns?: number;
}

export interface CliIo {
  readonly stdout: OutStream;
  readonly stderr: OutStream;
}

export const processIo: CliIo = { stdout: process.stdout, stderr: process.stderr };

/** Bad flags or arguments: exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

export const EXIT_OK = 0;
export const EXIT_RUNTIME = 1;
export const EXIT_USAGE = 2;
