"""Where flash_attention's time goes, kernel by kernel (GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/profile_flash.py [--d 128] [--lengths 4096,8192] [--causal]

For each length (bf16, batch x seq = 16384, 16 heads): tunes as the pipeline does (first call), then
profiles 20 forward and 20 forward+backward calls with torch.profiler and prints each CUDA kernel's time per
call and share of the call, with cuDNN's SDPA profiled the same way beside it. For the causal split (the
'/ws' forward over the key tiles no mask cuts, then the pointer kernel at the diagonal; the dK/dV kernel
likewise) it shows what each part costs, which the pipeline's totals cannot.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from kernels import flash_attention, tiles_in_use

CALLS = 20


def per_kernel(fn) -> list[tuple[str, float]]:
    """(kernel name, microseconds per call) for each CUDA kernel fn launches, the longest first."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    # device_time_total (torch >= 2.4): the kernel's own time on the GPU, summed over the calls
    rows = [(e.key, e.device_time_total / CALLS) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


def show(label: str, rows: list[tuple[str, float]]) -> None:
    total = sum(us for _, us in rows)
    print(f"{label}: {total:.1f} us per call", flush=True)
    for name, us in rows:
        print(f"    {us:9.1f} us  {us / total:6.1%}  {name[:110]}", flush=True)


def main(d: int, lengths: list[int], causal: bool) -> None:
    for n in lengths:
        b, h = max(1, 16384 // n), 16
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        ours = lambda: flash_attention(q, k, v, causal=causal)  # noqa: E731

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        torch.autograd.grad(ours(), (q, k, v), do)  # tunes every kernel of this shape
        print(f"\nd={d} S={n} B={b} H={h} causal={causal} tiles {tiles_in_use()}", flush=True)
        for label, fn in (("flash_attention", ours), ("sdpa_cudnn", cudnn)):
            with torch.no_grad():
                show(f"{label} forward", per_kernel(fn))
            show(f"{label} forward+backward", per_kernel(lambda: torch.autograd.grad(fn(), (q, k, v), do)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--lengths", default="4096,8192", help="comma-separated sequence lengths")
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_flash.py needs a CUDA GPU (it profiles CUDA kernels)")
    main(args.d, [int(x) for x in args.lengths.split(",")], args.causal)
