import { garbageCollector } from '@crisp/conformance';
import { describe, expect, it } from 'vitest';
import { deferFields } from './runtime/deferred-fields.js';

interface Stats {
  heads: number;
  a: Float64Array;
  b: Float64Array;
}

/** A stats-like object whose `a` and `b` come from a loader that counts its calls. */
function make(fail = false) {
  const calls = { n: 0 };
  const s = { heads: 2 } as Stats;
  const d = deferFields(s, ['a', 'b'], () => {
    calls.n++;
    if (fail) throw new Error('device gone');
    return { a: Float64Array.of(0.25, 0.75), b: Float64Array.of(1, 2, 3) };
  });
  return { s, d, calls };
}

describe('deferFields', () => {
  it('loads nothing until a field is read, then once for all fields, which become plain values', () => {
    const { s, calls } = make();
    expect(calls.n).toBe(0);
    expect(Array.from(s.a)).toEqual([0.25, 0.75]);
    expect(calls.n).toBe(1);
    expect(Array.from(s.b)).toEqual([1, 2, 3]);
    expect(s.a).toBe(s.a);
    expect(calls.n).toBe(1);
    const desc = Object.getOwnPropertyDescriptor(s, 'b');
    expect(desc?.get).toBeUndefined();
    expect(desc?.writable).toBe(false);
    expect(Object.keys(s)).toEqual(['heads', 'a', 'b']);
  });

  it('materialize loads an unread object once; reads after it and a second materialize do not load again', () => {
    const { s, d, calls } = make();
    d.materialize();
    expect(calls.n).toBe(1);
    d.materialize();
    expect(Array.from(s.b)).toEqual([1, 2, 3]);
    expect(calls.n).toBe(1);
  });

  it('a spread copy carries the values', () => {
    const { s, calls } = make();
    const copy = { ...s };
    expect(calls.n).toBe(1);
    expect(Array.from(copy.a)).toEqual([0.25, 0.75]);
    expect(Object.getOwnPropertyDescriptor(copy, 'a')?.get).toBeUndefined();
  });

  it('a load that fails in materialize is wrapped, kept, and thrown by every later read without loading again', () => {
    const calls = { n: 0 };
    const s = { heads: 1 } as Stats;
    const d = deferFields(
      s,
      ['a', 'b'],
      () => {
        calls.n++;
        throw new Error('device gone');
      },
      (e) => new RangeError(`released: ${(e as Error).message}`),
    );
    expect(() => d.materialize()).toThrow(RangeError);
    expect(() => s.a).toThrow('released: device gone');
    expect(() => s.b).toThrow(RangeError);
    expect(calls.n).toBe(1);
  });

  it('a failing read-triggered load throws and may be retried', () => {
    const { s, calls } = make(true);
    expect(() => s.a).toThrow('device gone');
    expect(() => s.a).toThrow('device gone');
    expect(calls.n).toBe(2);
  });
});

describe('deferFields and garbage collection', () => {
  it('the handle does not keep its object alive, not even in the job that made it', async () => {
    // a full collection on demand
    const gc = await garbageCollector();
    if (!gc) throw new Error('no garbage collection on demand in this runtime');
    // (no WeakRef here: one would keep its target alive to the end of this job)
    let collected = 0;
    const registry = new FinalizationRegistry(() => {
      collected++;
    });
    const handles = [];
    const token = {};
    for (let i = 0; i < 16; i++) {
      const s = { heads: 1 } as Stats;
      handles.push(deferFields(s, ['a', 'b'], () => ({ a: new Float64Array(1), b: new Float64Array(1) })));
      registry.register(s, i, token);
    }
    // collected in this job, as a loop of awaited prefills collects its plans' statistics;
    // the registry reports it in later tasks
    gc();
    for (let i = 0; i < 2; i++) await new Promise((r) => setTimeout(r, 0));
    // all 16 stay alive if the handles hold their objects (a WeakRef does, until the job
    // ends); V8 may keep the last one a while, so allow one
    expect(collected).toBeGreaterThanOrEqual(15);
    // (a use after the wait: a registry collected before it reports never reports)
    registry.unregister(token);
    for (const h of handles) h.materialize(); // loads into the handle, for no one: harmless
  });
});
