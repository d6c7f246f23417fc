/** Number formats shared by the reports' markdown tables. */

/** Milliseconds: 3 significant digits down to hundredths (1.47, 21.5, 342). */
export const ms = (x: number): string => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));

/** A sequence length: in k when a multiple of 1024 (128k), else as is. */
export const kn = (n: number): string => (n % 1024 === 0 ? `${n / 1024}k` : String(n));
