"""FlexPrefill's published code as a peer of crisp-bench's parity suite (runs on the GPU machine).

For each input of a manifest (a safetensors file with q [n, H, d], k and v [n, Hkv, d] in
bf16, the sampled query rows `rows` [r] int32, CRISP's flexPrefill output at those rows
`crisp_out` [r, H, d] and, optionally, other presets' outputs `also_<preset>` [r, H, d]), it

- runs `flex_prefill_attention(q, k, v, gamma, tau, min_budget=..., block_size=...,
  return_computational_ratio=True)` on q [1, n, H, d], k/v [1, n, Hkv, d] (bf16, CUDA,
  contiguous; GQA not interleaved: query head h reads KV head h // (H / Hkv)), timed with
  CUDA events (warm-up calls, then the median and range of `reps` calls);
- computes exact causal attention in float64 at the sampled rows and the relative error
  (Frobenius over those rows) of FlexPrefill's output and of CRISP's outputs against it;
- records what FlexPrefill decided per head, from the very call whose output is scored:
  the module-level functions `get_active_blocks`, `square_root_js_divergence` and
  `transform_veritcal_slash_idx` are wrapped for that call (flex_prefill_attention looks
  them up in its module's globals when it runs), so the block indices are the list the
  attention kernel received, the JSD distances are the values it compared with tau
  (`kl_div < tau`: query-aware, reported as route 'pe'; else vertical-slash, 'vs'), and the
  vertical / slash lists are the top-k indices it expanded (slash as the offset from the
  diagonal, 0 = the diagonal block). The timed calls run the unwrapped functions.

It writes a result JSON (--out) and, per input, the selected blocks as little-endian int32
flat indices I * Nb + J (query block I, key block J) of every head, concatenated, with the
per-head offsets in the JSON (`blocksPtr`).

FlexPrefill's code is never part of this repository: the peer loads
`flex_prefill/ops/flex_prefill_attention.py` from --flexprefill-dir (a folder holding the
`flex_prefill` package), default apps/bench/peers/.flexprefill beside this script (git-ignored).
It loads that one file, not the package (whose __init__ imports the transformers model
patches); `einops` and `transformers` are stood in for when missing (the file uses
einops.rearrange once, on one pattern, and transformers.utils.is_flash_attn_2_available
only to pick the dense kernel of inputs shorter than the sparse path's minimum).

    python3 apps/bench/peers/flexprefill_peer.py --manifest M.json --out R.json
    python3 apps/bench/peers/flexprefill_peer.py --self-check

Exit status: 0 done (per-input failures are recorded in the JSON), 2 usage or manifest
error, 3 torch / safetensors / numpy missing, 4 FlexPrefill's code missing or not
importable, 5 no CUDA device, 1 anything else.
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time
import types

EXIT_USAGE = 2
EXIT_NO_TORCH = 3
EXIT_NO_FLEXPREFILL = 4
EXIT_NO_CUDA = 5

OPS_FILE = os.path.join("flex_prefill", "ops", "flex_prefill_attention.py")
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".flexprefill")


def fail(code, message):
    sys.stderr.write(f"flexprefill_peer: {message}\n")
    sys.exit(code)


# ---------------------------------------------------------------- pure helpers (no torch)


def causal_blocks(nb):
    return nb * (nb + 1) // 2


def split_flat(indices, nb):
    """Flat block indices I * Nb + J -> (causal count, non-causal count) over unique entries."""
    seen = set(int(x) for x in indices)
    causal = sum(1 for x in seen if x // nb >= x % nb)
    return causal, len(seen) - causal


def routes_from_jsd(jsd, tau):
    """FlexPrefill's rule: `block_sparse_mask = kl_div < tau` (query-aware). NaN compares false: 'vs'."""
    return ["pe" if (d == d and d < tau) else "vs" for d in jsd]


def also_names(keys):
    """The presets whose outputs an input carries as tensors also_<preset> (CRISP's own presets
    on the same tensors, scored like crisp_out), sorted."""
    return sorted(k[len("also_"):] for k in keys if k.startswith("also_") and len(k) > len("also_"))


def sorted_unique(xs):
    return sorted(set(int(x) for x in xs))


def read_manifest(path):
    try:
        with open(path) as fh:
            man = json.load(fh)
    except (OSError, ValueError) as e:
        fail(EXIT_USAGE, f"cannot read the manifest {path}: {e}")
    need = ["inputs", "gamma", "tau", "min_budget", "block_size"]
    missing = [k for k in need if k not in man]
    if missing:
        fail(EXIT_USAGE, f"the manifest {path} lacks {', '.join(missing)}")
    if not isinstance(man["inputs"], list) or not all(isinstance(x, dict) and "file" in x and "name" in x for x in man["inputs"]):
        fail(EXIT_USAGE, "manifest inputs must be a list of {name, file}")
    man.setdefault("reps", 3)
    man.setdefault("warmup", 1)
    return man


class Capture:
    """Wraps module-level functions of `mod` for one call; records their results; restores them."""

    NAMES = ("get_active_blocks", "square_root_js_divergence", "transform_veritcal_slash_idx")

    def __init__(self, mod):
        self.mod = mod
        self.seen = {}
        self.saved = {}

    def __enter__(self):
        for name in self.NAMES:
            if not hasattr(self.mod, name):
                continue
            orig = getattr(self.mod, name)
            self.saved[name] = orig

            def wrapped(*args, _orig=orig, _name=name, **kwargs):
                out = _orig(*args, **kwargs)
                self.seen.setdefault(_name, []).append((args, kwargs, out))
                return out

            setattr(self.mod, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, orig in self.saved.items():
            setattr(self.mod, name, orig)
        return False


# ---------------------------------------------------------------- loading FlexPrefill


def install_shims():
    """Stand-ins for the two imports the ops file needs only in passing; returns what was shimmed."""
    shims = []
    if importlib.util.find_spec("einops") is None:

        def rearrange(x, pattern):
            if pattern.replace(" ", "") != "bhgij->b(hg)ij":
                raise NotImplementedError(f"einops shim: pattern {pattern!r}")
            b, h, g, i, j = x.shape
            return x.reshape(b, h * g, i, j)

        mod = types.ModuleType("einops")
        mod.rearrange = rearrange
        sys.modules["einops"] = mod
        shims.append("einops.rearrange (one pattern: 'b h g i j -> b (h g) i j', a reshape)")
    if importlib.util.find_spec("transformers") is None:
        tr = types.ModuleType("transformers")
        tu = types.ModuleType("transformers.utils")
        tu.is_flash_attn_2_available = lambda: False
        tr.utils = tu
        sys.modules["transformers"] = tr
        sys.modules["transformers.utils"] = tu
        shims.append("transformers.utils.is_flash_attn_2_available -> False (picks FlexPrefill's Triton dense kernel for short inputs)")
    return shims


def load_flexprefill(folder):
    folder = os.path.abspath(folder)
    path = os.path.join(folder, OPS_FILE)
    if not os.path.isfile(path) and os.path.isfile(os.path.join(folder, "ops", "flex_prefill_attention.py")):
        path = os.path.join(folder, "ops", "flex_prefill_attention.py")
    if not os.path.isfile(path):
        fail(
            EXIT_NO_FLEXPREFILL,
            f"FlexPrefill's code is not at {path}: copy the flex_prefill package of github.com/bytedance/FlexPrefill "
            f"into {folder} (see apps/bench/peers/README.md) or pass --flexprefill-dir",
        )
    try:
        import triton  # noqa: F401
    except Exception as e:
        fail(EXIT_NO_FLEXPREFILL, f"FlexPrefill needs triton, which does not import: {e}")
    try:
        shims = install_shims()
        spec = importlib.util.spec_from_file_location("crisp_flexprefill_ops", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as e:
        fail(EXIT_NO_FLEXPREFILL, f"FlexPrefill's {path} does not import: {type(e).__name__}: {e}")
    for name in ("flex_prefill_attention",) + Capture.NAMES:
        if not hasattr(mod, name):
            fail(EXIT_NO_FLEXPREFILL, f"{path} has no {name} (a FlexPrefill version this peer does not know)")
    return mod, path, shims


def source_commit(folder):
    for p in (os.path.join(folder, "COMMIT"), os.path.join(folder, "flex_prefill", "COMMIT")):
        if os.path.isfile(p):
            return open(p).read().strip()
    return None


# ---------------------------------------------------------------- the measurement


def dense_rows_f64(torch, q, k, v, rows):
    """Exact causal softmax attention in float64 at `rows`: [r, H, d] (q [n,H,d], k/v [n,Hkv,d])."""
    n, H, d = q.shape
    hkv = k.shape[1]
    g = H // hkv
    kd = k.double()
    vd = v.double()
    out = []
    for i in rows:
        qi = q[i].double().view(hkv, g, d)
        s = torch.einsum("cgd,jcd->cgj", qi, kd[: i + 1]) / math.sqrt(d)
        p = torch.softmax(s, dim=-1)
        out.append(torch.einsum("cgj,jcd->cgd", p, vd[: i + 1]).reshape(H, d))
    return torch.stack(out)


def rel_err(torch, a, ref):
    a = a.double()
    ref = ref.double()
    return float(torch.linalg.vector_norm(a - ref) / torch.linalg.vector_norm(ref))


def head_rel_errs(torch, a, ref):
    """The relative error of each head (Frobenius over the sampled rows and d) against ref [r, H, d]."""
    a = a.double()
    ref = ref.double()
    num = torch.linalg.vector_norm(a - ref, dim=(0, 2))
    den = torch.linalg.vector_norm(ref, dim=(0, 2))
    return [float(x) for x in (num / den).cpu()]


def decisions(torch, cap, H, nb, tau):
    """What the captured call decided: routes, JSD, vertical/slash lists, block indices per head."""
    out = {}
    gab = cap.seen.get("get_active_blocks")
    if not gab:
        raise RuntimeError("flex_prefill_attention did not call get_active_blocks (the input is below its sparse minimum?)")
    args, kwargs, block_idx = gab[-1]
    out["getActiveBlocksArgs"] = {
        "block_size": args[3],
        "gamma": args[4],
        "min_budget_blocks": args[5],
        "max_budget_blocks": args[6],
        "tau": args[7] if len(args) > 7 else kwargs.get("tau"),
    }
    heads = block_idx[0]
    flat = [h.to(torch.int64).cpu() for h in heads]
    out["blocks"] = flat
    jsd = cap.seen.get("square_root_js_divergence")
    if jsd:
        vals = jsd[-1][2].reshape(-1).float().cpu().tolist()
        out["jsd"] = [v if v == v else None for v in vals]
        out["routes"] = routes_from_jsd(vals, tau)
    tv = cap.seen.get("transform_veritcal_slash_idx")
    if tv:
        v_idx, s_idx = tv[-1][0][0], tv[-1][0][1]
        out["vertical"] = [sorted_unique(v_idx[0, h].cpu().tolist()) for h in range(H)]
        out["slash"] = [sorted_unique(s_idx[0, h].cpu().tolist()) for h in range(H)]
    return out


def count_kernel_check(torch, mod, flat, nb):
    """FlexPrefill's Triton row-count kernel against its own torch version on the captured indices."""
    padded = torch.nn.utils.rnn.pad_sequence([x.view(-1, 1) for x in flat], batch_first=True, padding_value=nb * (nb + 1))
    idx = padded.view(1, len(flat), -1).cuda().sort(-1).values
    a = mod.triton_column_count_cumsum(idx, nb)
    b = mod.torch_column_count_cumsum(idx, nb)
    return bool(torch.equal(a.to(torch.int64), b.to(torch.int64)))


def time_calls(torch, fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return ms


def run_input(torch, load_file, mod, man, item, out_dir):
    t = load_file(item["file"], device="cuda")
    q, k, v = t["q"].contiguous(), t["k"].contiguous(), t["v"].contiguous()
    if q.dtype != torch.bfloat16:
        raise RuntimeError(f"q is {q.dtype}; FlexPrefill's kernels take bfloat16")
    n, H, d = q.shape
    nb = math.ceil(n / man["block_size"])
    rows = t["rows"].to(torch.int64).cpu().tolist()
    r = {"name": item["name"], "n": n, "H": H, "Hkv": k.shape[1], "d": d, "numBlocks": nb}
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)

    def call():
        return mod.flex_prefill_attention(
            q4, k4, v4, man["gamma"], man["tau"],
            min_budget=man["min_budget"], max_budget=man.get("max_budget"),
            gqa_interleave=False, block_size=man["block_size"], return_computational_ratio=True,
        )

    with Capture(mod) as cap:
        o, ratio = call()
    torch.cuda.synchronize()
    dec = decisions(torch, cap, H, nb, man["tau"])
    ref = dense_rows_f64(torch, q, k, v, rows)
    o_rows = o[0].index_select(0, torch.tensor(rows, device=o.device))
    r["relErr"] = rel_err(torch, o_rows, ref)
    r["headRelErr"] = head_rel_errs(torch, o_rows, ref)
    if "crisp_out" in t:
        ours = t["crisp_out"].to(ref.device).view(len(rows), H, d)
        r["crispRelErr"] = rel_err(torch, ours, ref)
        r["crispHeadRelErr"] = head_rel_errs(torch, ours, ref)
    also = also_names(t.keys())
    if also:
        r["alsoRelErr"] = {name: rel_err(torch, t["also_" + name].to(ref.device).view(len(rows), H, d), ref) for name in also}
    r["ratio"] = float(ratio)
    r["causalRatio"] = float(ratio) * nb * nb / causal_blocks(nb)
    flat = dec.pop("blocks")
    # (each head's list is torch.unique's: sorted, no repeats)
    causal = [int(((x // nb) >= (x % nb)).sum()) for x in flat]
    r["density"] = [c / causal_blocks(nb) for c in causal]
    r["nonCausalBlocks"] = sum(x.numel() for x in flat) - sum(causal)
    # the ratio the attention returned, from the captured indices (equal when the capture is that call's)
    r["ratioFromBlocks"] = sum(x.numel() for x in flat) / (nb * nb * H)
    r.update(dec)
    try:
        r["countKernelAgrees"] = count_kernel_check(torch, mod, flat, nb)
    except Exception as e:  # a diagnostic only
        r["countKernelAgrees"] = f"not checked: {type(e).__name__}: {e}"
    blocks_file = os.path.join(out_dir, f"{item['name']}.blocks.i32")
    ptr = [0]
    with open(blocks_file, "wb") as fh:
        for x in flat:
            fh.write(x.to(torch.int32).numpy().astype("<i4").tobytes())
            ptr.append(ptr[-1] + x.numel())
    r["blocksFile"] = blocks_file
    r["blocksPtr"] = ptr
    del o, o_rows, ref, cap
    torch.cuda.empty_cache()
    ms = time_calls(torch, call, int(man["reps"]), int(man["warmup"]))
    r["ms"] = ms
    del t, q, k, v, q4, k4, v4
    torch.cuda.empty_cache()
    return r


def main_run(args):
    man = read_manifest(args.manifest)
    try:
        import numpy  # noqa: F401
        import torch
        from safetensors.torch import load_file
    except Exception as e:
        fail(EXIT_NO_TORCH, f"needs torch, safetensors and numpy ({type(e).__name__}: {e}); pip install torch safetensors numpy")
    if not torch.cuda.is_available():
        fail(EXIT_NO_CUDA, "PyTorch sees no CUDA device (FlexPrefill's kernels are Triton on CUDA)")
    folder = args.flexprefill_dir or man.get("flexprefill_dir") or DEFAULT_DIR
    mod, path, shims = load_flexprefill(folder)
    import triton

    out_dir = os.path.dirname(os.path.abspath(args.out))
    res = {
        "schema": "crisp-flexprefill-peer/1",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "flexprefill": {"file": path, "commit": source_commit(os.path.abspath(folder)), "shims": shims},
        "params": {k: man.get(k) for k in ("gamma", "tau", "min_budget", "max_budget", "block_size", "reps", "warmup")},
        "runs": [],
    }

    def save():
        tmp = f"{args.out}.tmp"
        with open(tmp, "w") as fh:
            json.dump(res, fh)
        os.replace(tmp, args.out)

    t0 = time.time()
    budget = float(man.get("budget_s", 1e9))
    for item in man["inputs"]:
        if time.time() - t0 > budget:
            res["runs"].append({"name": item["name"], "skipped": f"time budget of {budget:.0f} s"})
            continue
        try:
            r = run_input(torch, load_file, mod, man, item, out_dir)
            brief = {k: r[k] for k in ("name", "relErr", "crispRelErr", "causalRatio") if k in r}
            print(json.dumps(brief), flush=True)
        except Exception as e:  # one input's failure is a result, not the end of the run
            r = {"name": item["name"], "error": f"{type(e).__name__}: {str(e)[:600]}"}
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
        res["runs"].append(r)
        save()
    save()
    return 0


# ---------------------------------------------------------------- --self-check


def self_check():
    """What runs without a GPU: the pure helpers and the capture on a stand-in module; with torch, the float64 rows."""
    ok = True

    def check(cond, what):
        nonlocal ok
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        ok = ok and cond

    check(causal_blocks(4) == 10, "causal blocks of a 4x4 grid: 10")
    check(split_flat([0, 5, 8, 13, 14, 5, 2], 4) == (5, 1), "flat indices 0,5,8,13,14 causal, 2 = (0,2) not, duplicates once")
    check(routes_from_jsd([0.05, 0.1, 0.3, float("nan")], 0.1) == ["pe", "vs", "vs", "vs"], "routes: pe iff JSD < tau; NaN is vs")
    check(also_names(["q", "crisp_out", "also_crispGuarded", "also_crisp", "also_"]) == ["crisp", "crispGuarded"], "also_<preset> tensors name the other presets' outputs")
    stub = types.ModuleType("stub")
    stub.get_active_blocks = lambda *a, **k: [["blocks"]]
    stub.square_root_js_divergence = lambda p, q: p - q
    stub.transform_veritcal_slash_idx = lambda v, s, nb: (v, s)
    exec(
        "def flex_prefill_attention(x):\n"
        "    d = square_root_js_divergence(x, 1)\n"
        "    return get_active_blocks(d), transform_veritcal_slash_idx(1, 2, 3)\n",
        stub.__dict__,
    )
    orig = stub.get_active_blocks
    with Capture(stub) as cap:
        got = stub.flex_prefill_attention(5)
    check(got == ([["blocks"]], (1, 2)), "the wrapped call returns what the original does")
    check(cap.seen["square_root_js_divergence"][0][2] == 4 and cap.seen["get_active_blocks"][0][0] == (4,), "the capture records the JSD and the block call the attention made")
    check(stub.get_active_blocks is orig, "the functions are restored after the call")
    try:
        import torch
    except Exception as e:
        print(f"skip float64 rows: torch does not import ({type(e).__name__})")
        torch = None
    if torch is not None:
        g = torch.Generator().manual_seed(0)
        n, H, hkv, d = 96, 4, 2, 16
        q = torch.randn(n, H, d, generator=g)
        k = torch.randn(n, hkv, d, generator=g)
        v = torch.randn(n, hkv, d, generator=g)
        rows = [0, 17, 95]
        got = dense_rows_f64(torch, q, k, v, rows)
        kk = k.double().repeat_interleave(H // hkv, dim=1).permute(1, 0, 2)
        vv = v.double().repeat_interleave(H // hkv, dim=1).permute(1, 0, 2)
        full = torch.nn.functional.scaled_dot_product_attention(q.double().permute(1, 0, 2), kk, vv, is_causal=True).permute(1, 0, 2)
        check(rel_err(torch, got, full[rows]) < 1e-12, "float64 rows equal causal SDPA in float64 (GQA: head h reads KV head h // g)")
        bad = got.clone()
        bad[:, 1] *= 1.5
        he = head_rel_errs(torch, bad, got)
        check(abs(he[1] - 0.5) < 1e-12 and max(he[0], he[2], he[3]) == 0, "per-head errors: only the changed head's, and its size")
    folder = DEFAULT_DIR
    print(f"FlexPrefill's code {'found' if os.path.isfile(os.path.join(folder, OPS_FILE)) else 'absent'} at {os.path.join(folder, OPS_FILE)}")
    print("self-check passed" if ok else "self-check FAILED")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description="FlexPrefill as a crisp-bench peer")
    ap.add_argument("--manifest")
    ap.add_argument("--out")
    ap.add_argument("--flexprefill-dir", help="folder holding FlexPrefill's flex_prefill package (default: .flexprefill beside this script)")
    ap.add_argument("--self-check", action="store_true")
    args = ap.parse_args()
    if args.self_check:
        sys.exit(self_check())
    if not args.manifest or not args.out:
        ap.print_usage(sys.stderr)
        fail(EXIT_USAGE, "--manifest and --out are required (or --self-check)")
    sys.exit(main_run(args))


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:
        sys.stderr.write(f"flexprefill_peer: {type(e).__name__}: {e}\n")
        sys.exit(1)
