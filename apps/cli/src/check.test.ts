import { type DType, type HostTensor, hostTensor, mulberry32, toFloat32 } from '@crisp/core';
import { describe, expect, it } from 'vitest';
import { relativeErrorPerHead } from './check.js';

describe('relativeErrorPerHead', () => {
  for (const dtype of ['f32', 'bf16', 'f16'] as DType[]) {
    it(`matches ‖a − b‖ / ‖b‖ per head computed plainly (${dtype})`, () => {
      const rnd = mulberry32(7);
      const [n, H, d] = [37, 3, 16];
      const values = (amp: number) => Array.from({ length: n * H * d }, () => amp * (2 * rnd() - 1));
      const b: HostTensor = hostTensor(dtype, [n, H, d], values(1));
      const noise = values(0.01);
      const bf = toFloat32(b);
      const a: HostTensor = hostTensor(dtype, [n, H, d], Array.from(bf, (x, i) => x + noise[i]));
      const af = toFloat32(a);
      const diff = new Array(H).fill(0);
      const ref = new Array(H).fill(0);
      for (let i = 0; i < af.length; i++) {
        const h = Math.floor(i / d) % H;
        diff[h] += (af[i] - bf[i]) ** 2;
        ref[h] += bf[i] ** 2;
      }
      const got = relativeErrorPerHead(a, b, H, d);
      for (let h = 0; h < H; h++) {
        expect(got.perHead[h]).toBeCloseTo(Math.sqrt(diff[h] / ref[h]), 12);
        expect(got.perHead[h]).toBeGreaterThan(0);
      }
      const overall = Math.sqrt(diff.reduce((s, x) => s + x, 0) / ref.reduce((s, x) => s + x, 0));
      expect(got.overall).toBeCloseTo(overall, 12);
      expect(relativeErrorPerHead(b, b, H, d).overall).toBe(0);
    });
  }
});
