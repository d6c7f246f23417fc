"""Times PyTorch SDPA (flash and cuDNN backends) on one causal attention shape, for comparing
a kernel's dense rate at a shape the crisp-bench scenarios do not cover (e.g. d = 64).

Inputs are bf16 standard normal (scaled by 0.5), laid out [1, H, n, d] as SDPA takes them,
K/V with Hkv heads through enable_gqa. Prints one JSON object: per backend the median ms of
`--reps` timed runs after one warm-up, and the TFLOP/s counting causal work as 2·n²·H·d.
Each backend's timed runs sit in an NVTX range named `sdpa-<backend>`, so a profiler can take
exactly those launches (Nsight Compute: `--nvtx --nvtx-include "sdpa-cudnn/"`).

    python3 apps/bench/peers/sdpa_time.py --n 65536 --heads 32 --kv-heads 8 --head-dim 64
"""
import argparse
import json
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backends", default="flash,cudnn", help="comma-separated: flash, cudnn")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_time: no CUDA device")
    g = torch.Generator(device="cuda").manual_seed(7)
    shape = lambda h: (1, h, a.n, a.head_dim)
    q = (torch.randn(shape(a.heads), device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    k = (torch.randn(shape(a.kv_heads), device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    v = (torch.randn(shape(a.kv_heads), device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    flops = 2.0 * a.n * a.n * a.heads * a.head_dim
    out = {"n": a.n, "heads": a.heads, "kvHeads": a.kv_heads, "headDim": a.head_dim, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    known = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    names = [b for b in a.backends.split(",") if b]
    for name in names:
        if name not in known:
            raise SystemExit(f"sdpa_time: unknown backend {name!r} (flash, cudnn)")
    for name in names:
        backend = known[name]
        try:
            with sdpa_kernel([backend]):
                run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                run()
                torch.cuda.synchronize()
                ms = []
                torch.cuda.nvtx.range_push(f"sdpa-{name}")
                try:
                    for _ in range(a.reps):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        run()
                        e.record()
                        e.synchronize()
                        ms.append(s.elapsed_time(e))
                finally:
                    torch.cuda.nvtx.range_pop()
            med = statistics.median(ms)
            out[name] = {"ms": med, "tflops": flops / (med * 1e-3) / 1e12, "runs": ms}
        except RuntimeError as err:  # a backend that does not take this shape
            out[name] = {"error": str(err).splitlines()[0]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
