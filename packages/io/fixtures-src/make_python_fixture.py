#!/usr/bin/env python3
"""Interop fixtures for @crisp/io, written by the Python ecosystem's own libraries.

    python3 packages/io/fixtures-src/make_python_fixture.py packages/io/src/__fixtures__
        writes python-written.safetensors (needs safetensors, numpy and torch, for bf16)
        and the numpy-*.npy files (need numpy only).
    ... --npy-only   writes only the .npy files (a machine without safetensors/torch).

Values come from a formula the TypeScript test recomputes with @crisp/core's
round-to-nearest-even conversions:  x[t][i] = sin((i + 1000*t) * 0.37) * 3  in float64,
with t = 0, 1, 2 for q, k, v and i the flat index in canonical [n, H, d] order; each value
is rounded to float32 first (numpy), then to float16 (numpy) or bfloat16 (torch), so
both sides round the same float32 once. The expected bit patterns, in file order, are also
stored in __metadata__ as 'bits.<name>' (hex) and printed, so the test checks the
reader against Python's bytes without running Python.

If OUT_DIR holds ts-written.safetensors (written by @crisp/io's writer; the tests commit
one), it is loaded with safetensors.torch and checked against the same formula: the
TypeScript writer's output must be readable, bit-exactly, by the Python library.
"""
import hashlib
import math
import os
import sys

import numpy as np

N, H, HKV, D = 37, 4, 2, 8
FORMULA = "x[t][i] = sin((i + 1000*t) * 0.37) * 3, t = 0,1,2 for q,k,v, i = flat index in [n, H, d]"


def values_f32(t, heads):
    count = N * heads * D
    vals = [math.sin((i + 1000 * t) * 0.37) * 3.0 for i in range(count)]
    return np.array(vals, dtype=np.float64).astype(np.float32).reshape(N, heads, D)


def bf16_bits_numpy(f32):
    """Round-to-nearest-even float32 -> bfloat16 bits (no NaNs in these values)."""
    u = f32.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def hex_bits(arr_bits):
    width = arr_bits.dtype.itemsize * 2
    return "".join(format(int(b), "0%dx" % width) for b in arr_bits.reshape(-1))


def write_npy(out_dir):
    q32 = values_f32(0, H)
    files = {
        "numpy-f32.npy": q32,  # [n, H, d] float32
        "numpy-1nhd-f32.npy": q32.reshape(1, N, H, D),
        "numpy-f16-hnd.npy": np.ascontiguousarray(q32.astype(np.float16).transpose(1, 0, 2)),  # [H, n, d]
        "numpy-bf16-u2.npy": bf16_bits_numpy(q32),  # bf16 bit patterns as '<u2'
        "numpy-fortran.npy": np.asfortranarray(q32),
        "numpy-f64.npy": q32.astype(np.float64),
        "numpy-i8.npy": (q32 * 10).astype(np.int8),
        "numpy-bigendian.npy": q32.astype(">f4"),
    }
    for name, arr in files.items():
        np.save(os.path.join(out_dir, name), arr)
        print("%-24s %-6s %-14s order=%s sha256=%s" % (
            name, arr.dtype.str, arr.shape, "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C",
            hashlib.sha256(arr.tobytes(order="A")).hexdigest()[:16]))
    # Format version 2.0 (4-byte header length), which np.save only picks for huge headers.
    with open(os.path.join(out_dir, "numpy-f16-v2.npy"), "wb") as f:
        np.lib.format.write_array(f, q32.astype(np.float16), version=(2, 0))
    print("numpy-f16-v2.npy         <f2     (37, 4, 8)     format 2.0")


def expected_tensors(torch):
    """name -> torch tensor, in the layouts the TS test reads them with."""
    out = {}
    for dt in ("f32", "f16", "bf16"):
        for t, (role, heads) in enumerate((("q", H), ("k", HKV), ("v", HKV))):
            f32 = values_f32(t, heads)
            if dt == "f32":
                x = torch.from_numpy(f32.copy())
            elif dt == "f16":
                x = torch.from_numpy(f32.astype(np.float16))
            else:
                x = torch.from_numpy(f32.copy()).to(torch.bfloat16)
            out["%s_%s" % (role, dt)] = x
    out["q"], out["k"], out["v"] = out["q_bf16"], out["k_bf16"], out["v_bf16"]
    out["q_hnd_f16"] = out["q_f16"].permute(1, 0, 2).contiguous()  # [H, n, d]
    out["k_hnd_f32"] = out["k_f32"].permute(1, 0, 2).contiguous()
    out["q_1nhd_bf16"] = out["q_bf16"].reshape(1, N, H, D).contiguous()  # [1, n, H, d]
    return {k: v.clone() for k, v in out.items()}  # no shared storage: save_file refuses it


def bits_of(torch, x):
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[x.dtype]
    b = x.contiguous().view(view).numpy()
    return b.view(np.uint32 if b.itemsize == 4 else np.uint16)


def write_safetensors(out_dir):
    import torch
    from safetensors.torch import load_file, save_file

    tensors = expected_tensors(torch)
    metadata = {"formula": FORMULA, "writer": "safetensors.torch.save_file"}
    for name, x in tensors.items():
        metadata["bits." + name] = hex_bits(bits_of(torch, x))
    path = os.path.join(out_dir, "python-written.safetensors")
    save_file(tensors, path, metadata=metadata)
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))
    for name, x in tensors.items():
        b = bits_of(torch, x)
        print("  %-12s %-15s %-13s first bits %s sha256 %s" % (
            name, str(x.dtype), list(x.shape), hex_bits(b.reshape(-1)[:4]),
            hashlib.sha256(b.tobytes()).hexdigest()[:16]))

    ts_path = os.path.join(out_dir, "ts-written.safetensors")
    if os.path.exists(ts_path):
        loaded = load_file(ts_path)
        bad = []
        for name, x in loaded.items():
            want = tensors.get(name)
            if want is None:
                bad.append("%s: unexpected tensor" % name)
            elif want.dtype != x.dtype or list(want.shape) != list(x.shape):
                bad.append("%s: %s %s, expected %s %s" % (name, x.dtype, list(x.shape), want.dtype, list(want.shape)))
            elif not np.array_equal(bits_of(torch, x), bits_of(torch, want)):
                bad.append("%s: bits differ" % name)
        if bad or not loaded:
            print("FAIL ts-written.safetensors:", "; ".join(bad) or "no tensors")
            sys.exit(1)
        print("PASS ts-written.safetensors: %d tensors read by safetensors.torch, bit-exact" % len(loaded))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        print(__doc__)
        sys.exit(2)
    out_dir = args[0]
    os.makedirs(out_dir, exist_ok=True)
    write_npy(out_dir)
    if "--npy-only" not in sys.argv:
        write_safetensors(out_dir)


if __name__ == "__main__":
    main()
