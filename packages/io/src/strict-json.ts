/**
 * A strict JSON parser for safetensors headers. `JSON.parse` silently keeps the last of
 * two equal keys and turns `1.0` or `1e3` into integers; the format forbids duplicate keys
 * and its reference parser takes only plain integers for shapes and offsets. This parser
 * keeps objects as Maps (no prototype lookups), refuses duplicate keys at any depth,
 * records how each number was written, and bounds nesting depth.
 */

export type JsonValue = null | boolean | string | JsonNumber | JsonValue[] | JsonObject;
export type JsonObject = Map<string, JsonValue>;

/** A number as written: `integer` is set only for a plain integer token (no '.', no exponent). */
export class JsonNumber {
  constructor(
    readonly text: string,
    readonly value: number,
    readonly integer: bigint | undefined,
  ) {}
}

/** Where and why a text is not strict JSON. */
export class JsonSyntaxError extends Error {
  constructor(
    message: string,
    readonly position: number,
  ) {
    super(message);
    this.name = 'JsonSyntaxError';
  }
}

const MAX_DEPTH = 64;

export function isJsonObject(v: JsonValue | undefined): v is JsonObject {
  return v instanceof Map;
}

/** Parses `text` (one value, JSON whitespace around it). */
export function parseStrictJson(text: string): JsonValue {
  let i = 0;
  const n = text.length;
  const fail = (what: string): never => {
    throw new JsonSyntaxError(`${what} at character ${i}`, i);
  };
  const ws = () => {
    for (;;) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else return;
    }
  };
  const str = (): string => {
    const start = i; // at the opening quote
    i++;
    let escaped = false;
    for (;;) {
      if (i >= n) fail('an unterminated string');
      const c = text.charCodeAt(i);
      if (c === 0x22) break;
      if (c < 0x20) fail('a control character inside a string');
      if (c === 0x5c) {
        escaped = true;
        i += 2;
        continue;
      }
      i++;
    }
    i++;
    if (!escaped) return text.slice(start + 1, i - 1);
    try {
      return JSON.parse(text.slice(start, i)) as string;
    } catch {
      i = start;
      return fail('an invalid escape in a string');
    }
  };
  const num = (): JsonNumber => {
    const m = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
    m.lastIndex = i;
    const hit = m.exec(text);
    if (hit === null) return fail('an unexpected character');
    i += hit[0].length;
    const plain = hit[1] === undefined && hit[2] === undefined;
    return new JsonNumber(hit[0], Number(hit[0]), plain ? BigInt(hit[0]) : undefined);
  };
  const value = (depth: number): JsonValue => {
    if (depth > MAX_DEPTH) fail(`nesting deeper than ${MAX_DEPTH} levels`);
    ws();
    const c = text.charCodeAt(i);
    if (c === 0x7b) {
      i++;
      const out: JsonObject = new Map();
      ws();
      if (text.charCodeAt(i) === 0x7d) {
        i++;
        return out;
      }
      for (;;) {
        ws();
        if (text.charCodeAt(i) !== 0x22) fail('a missing object key');
        const keyAt = i;
        const key = str();
        if (out.has(key)) {
          i = keyAt;
          fail(`a duplicate key ${JSON.stringify(key)}`);
        }
        ws();
        if (text.charCodeAt(i) !== 0x3a) fail("a missing ':'");
        i++;
        out.set(key, value(depth + 1));
        ws();
        const d = text.charCodeAt(i);
        i++;
        if (d === 0x7d) return out;
        if (d !== 0x2c) {
          i--;
          fail("a missing ',' or '}'");
        }
      }
    }
    if (c === 0x5b) {
      i++;
      const out: JsonValue[] = [];
      ws();
      if (text.charCodeAt(i) === 0x5d) {
        i++;
        return out;
      }
      for (;;) {
        out.push(value(depth + 1));
        ws();
        const d = text.charCodeAt(i);
        i++;
        if (d === 0x5d) return out;
        if (d !== 0x2c) {
          i--;
          fail("a missing ',' or ']'");
        }
      }
    }
    if (c === 0x22) return str();
    if (text.startsWith('true', i)) {
      i += 4;
      return true;
    }
    if (text.startsWith('false', i)) {
      i += 5;
      return false;
    }
    if (text.startsWith('null', i)) {
      i += 4;
      return null;
    }
    if (i >= n) return fail('an unexpected end');
    return num();
  };
  const v = value(0);
  ws();
  if (i !== n) fail('unexpected characters after the value');
  return v;
}
