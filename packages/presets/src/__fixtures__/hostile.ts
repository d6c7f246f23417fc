/**
 * Shared pieces of the hostile-input suites: small seeded problems on the reference backend,
 * a poisoned output to prove nothing was written, a base policy to mutate, and the exact
 * CrispError code of a call.
 */
import {
  type Backend,
  type CrispErrorCode,
  type DeviceTensor,
  type DType,
  type HostTensor,
  hostTensor,
  isCrispError,
  mulberry32,
  type Policy,
  toFloat32,
} from '@crisp/core';
import { cStruct } from '@crisp/router';
import { globalCoverage, noiseFloor } from '@crisp/select';
import { expect } from 'vitest';

export interface Problem {
  readonly host: { readonly q: HostTensor; readonly k: HostTensor; readonly v: HostTensor };
  readonly q: DeviceTensor;
  readonly k: DeviceTensor;
  readonly v: DeviceTensor;
}

/** q [m, H, d], k and v [n, Hkv, d] of seeded N(0, 1) values (q scaled up so the heads differ). */
export function problem(
  be: Backend,
  s: { n: number; m?: number; H: number; Hkv?: number; d: number; dtype?: DType; seed: number },
): Problem {
  const r = mulberry32(s.seed);
  const g = () => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
  const make = (rows: number, heads: number, amp: number) =>
    hostTensor(s.dtype ?? 'f32', [rows, heads, s.d], Array.from({ length: rows * heads * s.d }, () => amp * g()));
  const host = { q: make(s.m ?? s.n, s.H, 2), k: make(s.n, s.Hkv ?? s.H, 1), v: make(s.n, s.Hkv ?? s.H, 1) };
  return { host, q: be.upload(host.q), k: be.upload(host.k), v: be.upload(host.v) };
}

/** An output tensor of the given shape holding NaN everywhere (the reference's allocate poisons). */
export function poisoned(be: Backend, dtype: DType, shape: readonly number[]): DeviceTensor {
  return be.allocate(dtype, shape);
}

/** Asserts `out` still holds only NaN: nothing was written into it. */
export async function untouched(be: Backend, out: DeviceTensor, msg: string): Promise<void> {
  const v = toFloat32(await be.download(out));
  let written = 0;
  for (let i = 0; i < v.length; i++) if (!Number.isNaN(v[i])) written++;
  expect(written, `${msg}: elements written into out`).toBe(0);
}

/** The code a promise rejects with (undefined when it resolves); any other rejection fails the test. */
export async function codeOf(p: Promise<unknown> | (() => unknown)): Promise<CrispErrorCode | undefined> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    if (isCrispError(e)) return e.code;
    throw new Error(`not a CrispError: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`, { cause: e });
  }
  return undefined;
}

/** The error a promise rejects with (a CrispError), or undefined. */
export async function errorOf(p: Promise<unknown>): Promise<(Error & { code?: string; cause?: unknown }) | undefined> {
  try {
    await p;
  } catch (e) {
    if (!isCrispError(e)) throw new Error(`not a CrispError: ${String(e)}`, { cause: e });
    return e;
  }
  return undefined;
}

/** A CRISP policy at block size B with kMin two blocks: small enough for n of a few hundred. */
export function basePolicy(B = 64): Policy {
  return {
    name: 'hostile',
    blockSize: B,
    kMin: 2 * B,
    router: cStruct(),
    vs: noiseFloor({ kMin: 2 * B }),
    pe: globalCoverage({ kMin: 2 * B }),
  };
}
