"""Which tile each FlashAttention kernel runs with: chosen once per shape bucket, remembered across processes.

A bucket is (kernel, dtype, padded head dim, causal, and each sequence length rounded up to a power of
two), so a training run whose lengths vary tunes once per bucket, not once per length. A choice is
looked up in this order:

1. a tile pinned by the user (``pin``): never tune;
2. this process's earlier choice for the bucket (a dict lookup: the per-call fast path);
3. the file ``KERNELS_TILE_CACHE`` names (default ``~/.cache/kernels-lab/flash_tiles.json``), written by
   earlier processes on the same GPU model and Triton version;
4. tuning: each candidate runs on the caller's own tensors and is timed with CUDA graphs, so tuning
   allocates nothing beyond the problem's working set (``triton.testing.do_bench`` flushes L2 with a
   256 MiB buffer).

Tuning is skipped, and the first candidate taken, when ``KERNELS_AUTOTUNE=0``, when only one candidate
fits, or while a CUDA graph is being captured (a capture cannot time anything). Inside ``untimed()`` every
candidate is launched once and none timed (a process that only compiles for another one's tuning).
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import _checks
from ._launch import serialized
from ._triton import triton

CACHE_ENV = "KERNELS_TILE_CACHE"
AUTOTUNE_ENV = "KERNELS_AUTOTUNE"
CAPTURE_MODE = "thread_local"  # the tuner's CUDA graph capture: other threads' CUDA calls stay allowed (_graph_ms)
_FORMAT = re.compile(r"(\d+)x(\d+)/w(\d+)/s(\d+)(/ws(/masked)?)?")


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    warps: int
    stages: int
    ws: bool = False  # a Hopper kernel (forward, dK/dV, dQ): tensor descriptors (TMA) and a warp-specialized loop
    # (forward, dK/dV; '/ws/masked') under a causal mask the Hopper kernel also runs the tiles the diagonal cuts,
    # masked, in one launch; a plain '/ws' tile leaves those to the pointer kernel (a second launch)
    masked: bool = False
    kwargs: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):  # the launch's keyword arguments, built once: this is on every call's path
        if self.masked and not self.ws:
            raise ValueError(f"a masked tile is a '/ws' tile: {self.block_m}x{self.block_n} is not")
        object.__setattr__(self, "kwargs", dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n,
                                                num_warps=self.warps, num_stages=self.stages))

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}/w{self.warps}/s{self.stages}" + ("/ws" if self.ws else "") \
            + ("/masked" if self.masked else "")

    @classmethod
    def parse(cls, text: str, name: str = "tile") -> Tile:
        """'128x64/w8/s3' -> Tile(128, 64, 8, 3): BLOCK_M x BLOCK_N / warps / pipeline stages; a '/ws'
        suffix names a warp-specialized Hopper kernel (the forward's, the dK/dV one's, the dQ one's), '/ws/masked'
        one that also takes a causal mask's diagonal."""
        match = _FORMAT.fullmatch(text) if isinstance(text, str) else None
        if not match:
            raise ValueError(f"{name} must look like '128x64/w8/s3' (BLOCK_M x BLOCK_N / warps / stages, "
                             f"optionally '/ws' or '/ws/masked'), got {text!r}")
        *sizes, ws, masked = match.groups()
        tile = cls(*map(int, sizes), ws=ws is not None, masked=masked is not None)
        for label, value in (("BLOCK_M", tile.block_m), ("BLOCK_N", tile.block_n), ("warps", tile.warps)):
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name}: {label} must be a power of two, got {value}")
        if tile.block_m < 16 or tile.block_n < 16 or tile.stages < 1:
            raise ValueError(f"{name}: BLOCK_M and BLOCK_N must be >= 16 and stages >= 1, got {text!r}")
        return tile


def bucket(n: int) -> int:
    """The power of two at or above n (at least 16): lengths that share it share a tile."""
    return max(16, 1 << (n - 1).bit_length())


def autotune() -> bool:
    return _checks.switch(AUTOTUNE_ENV)


def cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kernels-lab" / "flash_tiles.json")


_chosen: dict[tuple, Tile] = {}
_pinned: dict[str, Tile] = {}
timings: dict[tuple, dict[str, float]] = {}  # bucket -> {tile: median ms} of every tuning this process ran
generation = 0  # counts pin() and forget() calls: what was planned with earlier choices is stale
_untimed = False  # inside untimed(): every candidate launched once, none timed or remembered


def pin(kinds, **tiles: str | None) -> None:
    """Run each named kernel with this tile from now on, in every bucket; None unpins it, and no
    argument at all unpins every kernel. ``kinds`` are the kernel names that may be pinned."""
    global generation
    for kind in tiles:  # every argument checked before any takes effect: a refused call pins nothing
        if kind not in kinds:
            raise ValueError(f"no FlashAttention kernel {kind!r} to pin; the kernels are {', '.join(kinds)}")
    parsed = {kind: None if text is None else Tile.parse(text, kind) for kind, text in tiles.items()}
    generation += 1
    if not tiles:
        _pinned.clear()
    for kind, tile in parsed.items():
        if tile is None:
            _pinned.pop(kind, None)
        else:
            _pinned[kind] = tile


@contextlib.contextmanager
def untimed():
    """Inside, a bucket's choice launches every candidate once, untimed, and takes the first, remembering
    nothing (neither in this process nor in the cache file): a process that only fills Triton's on-disk
    cache for another process's tuning (lab/ahead.py) builds every kernel that tuning will run."""
    global _untimed
    before, _untimed = _untimed, True
    try:
        yield
    finally:
        _untimed = before


def forget() -> None:
    """Drop this process's choices, pins and tuning times (the cache file stays): the next call looks up
    or tunes again."""
    global generation
    generation += 1
    _chosen.clear()
    _pinned.clear()
    timings.clear()


def _file_key() -> str:
    return f"{torch.cuda.get_device_name()} | triton {triton.__version__}"


def _read() -> dict:
    """The cache file's {GPU and Triton: {bucket: tile}}; {} when there is none, and, with a warning naming
    it, when it is not such a file (not JSON, binary, a directory, unreadable): it is then rewritten whole."""
    path = cache_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:  # no cache yet: tune
        return {}
    except (OSError, ValueError) as e:  # a directory, no permission, binary (UnicodeDecodeError), not JSON
        return _ignored(path, f"{type(e).__name__}: {e}")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        return _ignored(path, "it is not a JSON object of {GPU: {bucket: tile}}")
    return data


def _ignored(path: Path, why: str) -> dict:
    warnings.warn(f"ignoring the FlashAttention tile cache {path} ({why}); tiles are tuned again and the "
                  f"file rewritten (set {CACHE_ENV} to use another)", RuntimeWarning, stacklevel=3)
    return {}


def _stored(key: tuple) -> Tile | None:
    """The cache file's tile for this bucket, if it has a valid one."""
    text = _read().get(_file_key(), {}).get("|".join(map(str, key)))
    try:
        return None if text is None else Tile.parse(text)
    except ValueError as e:
        _ignored(cache_path(), f"its entry for {key}: {e}")
        return None


def _write(key: tuple, tile: Tile) -> None:
    """Add one choice to the cache file, atomically (another process may be writing it too). A file that
    cannot be written (a directory in its place, a read-only disk) is warned about, not raised: the
    choice still holds for this process."""
    path = cache_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read()
        data.setdefault(_file_key(), {})["|".join(map(str, key))] = str(tile)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        warnings.warn(f"could not write the FlashAttention tile cache {path} ({type(e).__name__}: {e}); the "
                      "tile chosen is kept for this process only", RuntimeWarning, stacklevel=3)


def _graph_ms(fn, rep_ms: float = 10.0, replays: int = 10) -> float:
    """Median time of one ``fn()`` in ms, from replays of a CUDA graph of about ``rep_ms`` of calls, on a new
    stream: what triton.testing.do_bench_cudagraph measures, but captured in thread-local mode. In global
    mode CUDA may refuse other threads' "potentially unsafe" calls (cudaMalloc, say) while the capture is
    open: an application thread's own CUDA work while a tile is tuned (on an H100 with driver 580 it let a
    driver allocation through in either mode). A device-wide synchronization from another thread still
    fails a capture in any mode."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compiles and warms up outside the capture
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        estimate = start.elapsed_time(end) / 5
        calls = max(1, int(rep_ms / estimate)) if estimate > 0 else 1000
        # capture_begin/end rather than torch.cuda.graph, whose entry synchronizes the device and empties the
        # allocator's cache: other threads' business, which would also fail a capture of their own.
        graph, collecting = torch.cuda.CUDAGraph(), gc.isenabled()
        gc.disable()  # a collected Triton kernel would unload its module mid-capture, which fails the capture
        try:
            graph.capture_begin(capture_error_mode=CAPTURE_MODE)
            try:
                for _ in range(calls):
                    fn()
            finally:
                graph.capture_end()
        finally:
            if collecting:
                gc.enable()
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def _wait_for_caller() -> None:
    """_graph_ms times on a new stream that does not wait for the caller's: its first runs would
    overlap the caller's queued kernels, writing buffers they still use (a freed tensor-descriptor scratch,
    the forward's lse): the likely cause of the "illegal instruction" and NaN gradients seen on the H200 when
    six processes tuned at once, each one's kernels queued for longer. So tuning starts when they are done."""
    torch.cuda.current_stream().synchronize()


@serialized  # one thread tunes at a time, and no other thread launches a kernel of ours meanwhile
def choose(key: tuple, candidates: list[Tile], run) -> Tile:
    """The tile for bucket ``key`` (its first item names the kernel); ``run(tile)`` launches it once."""
    tile = _pinned.get(key[0]) or _chosen.get(key)
    if tile is not None:
        return tile
    if _untimed:
        ran = []
        for candidate in candidates:
            with contextlib.suppress(triton.runtime.errors.OutOfResources):  # as tuning skips it
                run(candidate)
                ran.append(candidate)
        return (ran or candidates)[0]
    if not autotune() or len(candidates) == 1:
        tile = _chosen[key] = candidates[0]
        return tile
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return candidates[0]  # not remembered: a later call outside the capture still tunes
    stored = _stored(key)
    if stored in candidates:
        tile = _chosen[key] = stored
        return tile
    if torch.cuda.is_available():
        _wait_for_caller()
    timings[key] = {}
    for candidate in candidates:
        try:
            ms = _graph_ms(lambda: run(candidate))
        except triton.runtime.errors.OutOfResources:  # more shared memory or registers than this GPU has
            continue
        timings[key][str(candidate)] = ms
    if not timings[key]:
        raise RuntimeError(f"no FlashAttention tile fits this GPU for {key}; tried {', '.join(map(str, candidates))}")
    tile = _chosen[key] = Tile.parse(min(timings[key], key=timings[key].get))
    _write(key, tile)
    return tile
