"""Dump the post-RoPE Q/K/V of every attention layer of a Hugging Face causal LM, in the
layout `crisp run --qkv DIR` reads: one safetensors file per layer, DIR/layer_NN.safetensors,
each with tensors q [n, H, d], k [n, Hkv, d] and v [n, Hkv, d] (`--layout nhd`, the model's
dtype or --dtype), and __metadata__ crisp.layer, crisp.layers (the layers dumped, so a dump of
chosen layers is not taken for one with gaps), crisp.model, crisp.scale (the model's softmax
scale) and crisp.layout.

    python3 apps/bench/peers/dump_qkv.py --model meta-llama/Llama-3.2-1B --text-file prompt.txt --out dump/
    python3 apps/bench/peers/dump_qkv.py --model ./my-model --text-file prompt.txt --out dump/ --layers 0,5,10 --dtype bf16
    crisp run --qkv dump/ --out outputs/
    python3 apps/bench/peers/dump_qkv.py --self-test

How Q/K/V are caught after RoPE: with transformers >= 4.48 the script registers an attention
function of its own (transformers.AttentionInterface) and loads the model with
attn_implementation set to it; every attention layer calls it with query [batch, H, n, d] and
key, value [batch, Hkv, n, d] after the rotary embedding (key and value before GQA repeats),
and it records them and calls transformers' SDPA attention, so the forward pass is the model's
own. With older transformers it falls back to wrapping the model module's
apply_rotary_pos_emb (q and k after RoPE, in layer order) and a forward hook on each v_proj.

--self-test builds a randomly initialised tiny Llama model (no download), dumps it, reads the
files back and checks per layer that dense causal softmax attention in float64 over the dumped
Q/K/V reproduces the output the model's SDPA call returned.

Needs torch and transformers (and numpy); without them it says so and exits with status 2.
Only the first sequence of the batch is dumped (CRISP runs one sequence).
"""
import argparse
import json
import os
import sys
import tempfile

EXIT_MISSING = 2
RECORDER = "crisp_record"


def need(*modules):
    """Imports the named modules, or exits with a clear message naming what is missing."""
    out = []
    missing = []
    for name in modules:
        try:
            out.append(__import__(name))
        except ImportError:
            missing.append(name)
    if missing:
        sys.stderr.write(
            "dump_qkv.py: needs %s (not importable here): pip install torch transformers numpy\n" % ", ".join(missing)
        )
        sys.exit(EXIT_MISSING)
    return out if len(out) > 1 else out[0]


# ------------------------------------------------------------------ safetensors, numpy only

ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def write_safetensors(path, tensors, metadata):
    """Writes {name: (dtype name, numpy array)} as safetensors; bfloat16 arrays are given as
    their uint16 bit patterns. Atomic: a temporary file in the same directory, flushed, then
    renamed over `path`; on any error the temporary file is removed."""
    header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    offset = 0
    blobs = []
    for name, (dtype, arr) in tensors.items():
        if dtype not in ST_DTYPES:
            raise ValueError("tensor %s: dtype %s is not one of %s" % (name, dtype, ", ".join(ST_DTYPES)))
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_safetensors(path):
    """{name: (safetensors dtype, numpy array)} and the metadata; BF16 comes back as uint16 bits."""
    np = need("numpy")
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        base = 8 + size
        meta = header.pop("__metadata__", {})
        out = {}
        for name, h in header.items():
            a, b = h["data_offsets"]
            f.seek(base + a)
            buf = f.read(b - a)
            np_dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[h["dtype"]]
            out[name] = (h["dtype"], np.frombuffer(buf, dtype=np_dtype).reshape(h["shape"]))
    return out, meta


def layer_file(out_dir, layer, last):
    return os.path.join(out_dir, "layer_%0*d.safetensors" % (max(2, len(str(last))), layer))


# ------------------------------------------------------------------ recording


class Recorder:
    """Keeps nothing but what it is told to: each wanted layer is written as soon as its
    attention ran (one layer's Q/K/V in host memory at a time)."""

    def __init__(self, out_dir, layers, num_layers, dtype, model_name, keep_outputs=False):
        self.out_dir = out_dir
        self.layers = sorted(layers) if layers is not None else list(range(num_layers))
        self.wanted = set(self.layers)
        self.dtype = dtype
        self.model_name = model_name
        self.written = []
        self.outputs = {} if keep_outputs else None
        self.scales = {}

    def torch_to_numpy(self, t):
        torch = need("torch")
        t = t.detach().to("cpu")
        if self.dtype is not None:
            t = t.to(self.dtype)
        if t.dtype == torch.bfloat16:
            return "bfloat16", t.contiguous().view(torch.int16).numpy().view("uint16")
        if t.dtype == torch.float16:
            return "float16", t.contiguous().numpy()
        return "float32", t.to(torch.float32).contiguous().numpy()

    def record(self, layer, q, k, v, scale):
        """q [H, n, d], k and v [Hkv, n, d] (one sequence, heads first, after RoPE)."""
        if layer not in self.wanted:
            return
        names = {}
        for role, t in (("q", q), ("k", k), ("v", v)):
            names[role] = self.torch_to_numpy(t.transpose(0, 1))  # -> [n, heads, d]
        meta = {
            "crisp.layer": layer,
            "crisp.layers": ",".join(str(x) for x in self.layers),
            "crisp.model": self.model_name,
            "crisp.layout": "nhd",
        }
        if scale is not None:
            meta["crisp.scale"] = repr(float(scale))
            self.scales[layer] = float(scale)
        path = layer_file(self.out_dir, layer, self.layers[-1])
        write_safetensors(path, names, meta)
        self.written.append(path)
        sys.stderr.write("dump_qkv.py: layer %d -> %s\n" % (layer, path))


def register_recorder(rec):
    """transformers >= 4.48: an attention function of our own, in front of the SDPA one."""
    import transformers
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def recording_attention(module, query, key, value, attention_mask, **kwargs):
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError("dump_qkv.py: an attention module without layer_idx; this model is not supported by the recorder")
        rec.record(layer, query[0], key[0], value[0], kwargs.get("scaling", getattr(module, "scaling", None)))
        out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        if rec.outputs is not None and layer in rec.wanted:
            rec.outputs[layer] = out[0].detach().to("cpu")  # [n, H, d]
        return out, weights

    transformers.AttentionInterface.register(RECORDER, recording_attention)
    return RECORDER


def attach_fallback(model, rec):
    """Older transformers: wrap the modeling module's apply_rotary_pos_emb (q, k after RoPE,
    called once per layer in order) and hook every v_proj (v, reshaped to heads)."""
    module = sys.modules[type(model).__module__]
    if not hasattr(module, "apply_rotary_pos_emb"):
        raise RuntimeError(
            "dump_qkv.py: transformers is older than 4.48 (no AttentionInterface) and %s has no apply_rotary_pos_emb to wrap; upgrade transformers"
            % module.__name__
        )
    original = module.apply_rotary_pos_emb
    state = {"calls": 0, "v": {}}
    cfg = model.config
    hkv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def wrapped(q, k, *args, **kwargs):
        q2, k2 = original(q, k, *args, **kwargs)
        layer = state["calls"]
        state["calls"] += 1
        v = state["v"].pop(layer)
        rec.record(layer, q2[0], k2[0], v, head_dim ** -0.5)
        return q2, k2

    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(_mod, _inp, out, i=i):
            b, n, _ = out.shape
            state["v"][i] = out.view(b, n, hkv, head_dim)[0].transpose(0, 1)

        hooks.append(layer.self_attn.v_proj.register_forward_hook(hook))
    module.apply_rotary_pos_emb = wrapped
    return lambda: ([h.remove() for h in hooks], setattr(module, "apply_rotary_pos_emb", original))


def has_attention_interface():
    try:
        import transformers

        return hasattr(transformers, "AttentionInterface")
    except ImportError:
        return False


# ------------------------------------------------------------------ the dump


def parse_layers(s, num_layers):
    if s is None:
        return None
    try:
        layers = sorted({int(x) for x in s.split(",") if x.strip() != ""})
    except ValueError:
        raise SystemExit("dump_qkv.py: --layers takes layer numbers separated by commas, e.g. 0,5,10; got %r" % s)
    bad = [x for x in layers if x < 0 or x >= num_layers]
    if not layers or bad:
        raise SystemExit("dump_qkv.py: --layers %r: the model has layers 0..%d" % (s, num_layers - 1))
    return layers


def torch_dtype(name):
    torch = need("torch")
    return {None: None, "bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def dump(args):
    torch, transformers = need("torch", "transformers")
    need("numpy")
    if args.text_file is not None:
        with open(args.text_file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = args.text
    os.makedirs(args.out, exist_ok=True)
    dtype = torch_dtype(args.dtype)
    tok = transformers.AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    ids = tok(text, return_tensors="pt").input_ids
    if args.max_tokens is not None:
        ids = ids[:, : args.max_tokens]
    config = transformers.AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    layers = parse_layers(args.layers, config.num_hidden_layers)
    rec = Recorder(args.out, layers, config.num_hidden_layers, dtype, args.model)
    load = dict(torch_dtype=dtype or "auto", trust_remote_code=args.trust_remote_code)
    detach = None
    if has_attention_interface():
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=register_recorder(rec), **load)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager", **load)
        detach = attach_fallback(model, rec)
    model.to(args.device).eval()
    with torch.no_grad():
        model(ids.to(args.device), use_cache=False)
    if detach:
        detach()
    missing = sorted(set(rec.layers) - {int(p.rsplit("_", 1)[1].split(".")[0]) for p in rec.written})
    if missing:
        raise SystemExit("dump_qkv.py: layers %s never reached an attention call; nothing else was written" % missing)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    odd = {l: s for l, s in rec.scales.items() if abs(s - head_dim ** -0.5) > 1e-6 * head_dim ** -0.5}
    if odd:
        sys.stderr.write(
            "dump_qkv.py: note: this model's softmax scale is %r, not 1/sqrt(d); crisp run uses 1/sqrt(d) (crisp.scale in each file has the model's)\n"
            % next(iter(odd.values()))
        )
    print("dump_qkv.py: %d layers of %d tokens in %s; run: crisp run --qkv %s" % (len(rec.written), ids.shape[1], args.out, args.out))


# ------------------------------------------------------------------ --self-test


def dense_attention_f64(q, k, v, scale):
    """Causal softmax attention in float64: q [n, H, d], k and v [n, Hkv, d] -> [n, H, d]."""
    np = need("numpy")
    n, H, d = q.shape
    hkv = k.shape[1]
    out = np.zeros((n, H, d), dtype=np.float64)
    mask = np.triu(np.ones((n, n), dtype=bool), 1)
    for h in range(H):
        g = h // (H // hkv)
        s = (q[:, h, :] @ k[:, g, :].T) * scale
        s[mask] = -np.inf
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[:, g, :]
    return out


def self_test(args):
    torch, transformers = need("torch", "transformers")
    np = need("numpy")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
    )
    n = 96
    ids = torch.randint(0, config.vocab_size, (1, n))
    with tempfile.TemporaryDirectory(prefix="crisp-dump-self-test-") as out:
        rec = Recorder(out, None, config.num_hidden_layers, torch.float32, "self-test tiny llama", keep_outputs=True)
        if has_attention_interface():
            model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=register_recorder(rec), torch_dtype=torch.float32)
        else:
            model = transformers.LlamaForCausalLM(config)
            detach = attach_fallback(model, rec)
        model.eval()
        with torch.no_grad():
            model(ids, use_cache=False)
        worst = 0.0
        files = sorted(os.listdir(out))
        expect = ["layer_%02d.safetensors" % i for i in range(config.num_hidden_layers)]
        if files != expect:
            raise SystemExit("self-test failed: wrote %s, expected %s" % (files, expect))
        for layer in range(config.num_hidden_layers):
            tensors, meta = read_safetensors(os.path.join(out, expect[layer]))
            q, k, v = (tensors[r][1].astype(np.float64) for r in ("q", "k", "v"))
            if q.shape != (n, 4, 32) or k.shape != (n, 2, 32) or v.shape != (n, 2, 32):
                raise SystemExit("self-test failed: layer %d shapes q %s k %s v %s" % (layer, q.shape, k.shape, v.shape))
            if meta.get("crisp.layer") != str(layer) or meta.get("crisp.layers") != "0,1,2" or meta.get("crisp.layout") != "nhd":
                raise SystemExit("self-test failed: layer %d metadata %s" % (layer, meta))
            mine = dense_attention_f64(q, k, v, float(meta.get("crisp.scale", 32 ** -0.5)))
            if rec.outputs is not None and layer in rec.outputs:
                theirs = rec.outputs[layer].to(torch.float64).numpy()
            else:
                raise SystemExit("self-test failed: the fallback path keeps no SDPA outputs to compare; upgrade transformers to >= 4.48")
            err = float(np.abs(mine - theirs).max() / max(1e-30, np.abs(theirs).max()))
            worst = max(worst, err)
            print("layer %d: q %s, k %s, v %s; max |float64 dense - model SDPA| / max |SDPA| = %.3g" % (layer, q.shape, k.shape, v.shape, err))
            if err > 1e-4:
                raise SystemExit("self-test failed: layer %d: the dumped Q/K/V do not reproduce the model's attention (relative error %.3g)" % (layer, err))
    print("self-test passed: %d layers, worst relative error %.3g" % (config.num_hidden_layers, worst))


def main(argv=None):
    p = argparse.ArgumentParser(description="Dump post-RoPE Q/K/V per layer of a Hugging Face causal LM for `crisp run --qkv DIR`.")
    p.add_argument("--model", help="a Hugging Face model id or a local path")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text-file", help="the prompt, a UTF-8 text file")
    src.add_argument("--text", help="the prompt, inline")
    p.add_argument("--out", help="the directory that gets layer_NN.safetensors (created if missing)")
    p.add_argument("--layers", help="only these layers, comma-separated (default: every layer)")
    p.add_argument("--dtype", choices=["bf16", "f16", "f32"], help="load the model and store Q/K/V in this dtype (default: the model's)")
    p.add_argument("--max-tokens", type=int, help="cut the prompt to this many tokens")
    p.add_argument("--device", default="cpu", help="where the forward pass runs: cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own code (transformers' trust_remote_code)")
    p.add_argument("--self-test", action="store_true", help="check the recorder on a random tiny Llama (no download) and exit")
    args = p.parse_args(argv)
    if args.self_test:
        self_test(args)
        return
    if not args.model or not args.out or (args.text is None and args.text_file is None):
        p.error("--model, --out and one of --text-file or --text are required (or --self-test)")
    dump(args)


if __name__ == "__main__":
    main()
