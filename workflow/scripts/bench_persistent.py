"""The forms of flash_attention that are off by default (the one-pass or the two-pass backward at every
shape, where the default picks one per shape; '/ws' dK/dV tiles at head_dim 64; the causal persistent
forward's tile loop pipelined; other sizes of the longest-first groups; the pointer dQ kernel alone) and the
default without two of its choices (the '/ws/masked' tiles, which the tuner weighs against the split at the
diagonal under a causal mask; BWD_LONGEST_FIRST) beside the default (GPU only, Hopper; not part of the
pipeline). Its figures are in tune_flash.py's docstring.

    PYTHONPATH=.:workflow python workflow/scripts/bench_persistent.py out.csv [setting ...]

Each setting below (or those named; "default" always, first) is applied to the module, then: the errors
against fp64 (output and the three gradients, bf16, head_dim 128 and 64, causal and not, '/ws' tiles
pinned) at lengths whose tiles end mid-way; and, at bf16, batch x seq = 16384, 16 heads, forward and
forward+backward TFLOP/s (do_bench medians; 4·B·H·S²·D, x 0.5 causal, x 3.5 with the backward), tuned
afresh, beside cuDNN in the same process. One CSV row per measurement; the summary is printed.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels._flash_attention as fa  # first: it chooses the backend before triton is imported
from kernels import _flash_tiles
from kernels._triton import triton
from bench_ws_causal import max_errors  # this folder is the script's first import path

SETTINGS = {  # name -> module attributes (BACKWARD: the backward, as KERNELS_FLASH_BACKWARD names it)
    "default": {},
    "one_pass": {"BACKWARD": "one_pass"},
    "two_pass": {"BACKWARD": "two_pass"},
    "no_masked": {"MASKED_KINDS": ()},
    "no_longest_first": {"BWD_LONGEST_FIRST": False},
    "lpt_one_group": {"LPT_GROUP_BYTES": 0},  # longest first over every head at once (before LPT_GROUP_BYTES)
    "lpt_8mb": {"LPT_GROUP_BYTES": 8 * 2**20},
    "lpt_64mb": {"LPT_GROUP_BYTES": 64 * 2**20},
    "ws64_dkdv": {"BACKWARD": "two_pass", "WS_HEAD_DIMS": {"fwd": (64, 128), "bwd_dkdv": (64, 128), "bwd_dq": (128,)}},
    "no_ws_dq": {"WS_HEAD_DIMS": {"fwd": (64, 128), "bwd_dkdv": (128,), "bwd_dq": ()}},  # the pointer dQ kernel only
    # the persistent '/ws' forward's next query tile loaded early under a causal mask too (head-dim blocks <= 64;
    # causal programs run several tiles since the tenth round, and 2 stages paid +3-6% without the mask)
    "causal_stages2": {"tile_stages": lambda block_d, causal: 2 if block_d <= 64 else 1},
}
ERROR_LENGTHS = [(1000, 1000), (300, 1100), (1100, 300), (2048, 2048)]
SPEED = [(d, causal, s) for d in (128, 64) for causal in (False, True) for s in (4096, 16384)]


DEFAULTS = {name: getattr(fa, name) for s in SETTINGS.values() for name in s if name != "BACKWARD"}
CACHE = tempfile.mkdtemp()


def apply(name: str) -> None:
    """The setting's module attributes (the others at their defaults), tuned afresh: no tile chosen under
    another setting, in this process or in a cache file (one per setting)."""
    setting = dict(SETTINGS[name])
    os.environ[fa.BACKWARD_ENV] = setting.pop("BACKWARD", "auto")
    for attr, value in {**DEFAULTS, **setting}.items():
        setattr(fa, attr, value)
    os.environ[_flash_tiles.CACHE_ENV] = os.path.join(CACHE, f"{name}.json")
    fa._candidates.cache_clear()
    _flash_tiles.forget()


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main(path: str, names: list[str]) -> None:
    os.environ.setdefault(fa.WS_ENV, "1")  # the '/ws' kernels studied here (the default; a caller's 0 stays)
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    rows = []
    for name in ["default", *[n for n in names or SETTINGS if n != "default"]]:
        apply(name)
        for d in (128, 64):
            for causal in (False, True):
                rows.append(dict(setting=name, d=d, causal=causal, what="max_error",
                                 **max_errors(d, causal, ERROR_LENGTHS)))
        for d, causal, n in SPEED:
            b, h = 16384 // n, 16
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            chosen = fa.tune(q, k, v, causal=causal)
            for provider, fwd in (("flash", lambda: fa.flash_attention(q, k, v, causal=causal)), ("cudnn", cudnn)):
                with torch.no_grad():
                    ms = bench(fwd)
                rows.append(dict(setting=name, d=d, causal=causal, seq=n, what=f"fwd {provider}", tflops=flops / ms / 1e9,
                                 tile=chosen["fwd"] if provider == "flash" else ""))
                ms = bench(lambda: fwd().backward(do))
                rows.append(dict(setting=name, d=d, causal=causal, seq=n, what=f"fwd_bwd {provider}",
                                 tflops=3.5 * flops / ms / 1e9, tile=str(chosen) if provider == "flash" else ""))
            print(pd.DataFrame(rows).tail(4).to_string(), flush=True)
        pd.DataFrame(rows).to_csv(path, index=False)  # after each setting: a run cut short keeps what it measured
    apply("default")
    df = pd.DataFrame(rows)
    speed = df[df.what != "max_error"].pivot_table(index=["d", "causal", "seq", "what"], columns="setting", values="tflops")
    print(df[df.what == "max_error"].to_string())
    print(speed.round(1).to_string())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("settings", nargs="*", help=f"settings to time beside the default: {', '.join(SETTINGS)}")
    args = parser.parse_args()
    main(args.out, args.settings)
