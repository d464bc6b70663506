"""The bench's instruments: per-stage timers (exclusive, per thread, wall and CPU), the patching
that puts them around the suite's own functions for the duration of a run, the stage clock of the
loop references, peak-RSS sampling, thread limits, the memory-size parser, and the provenance
(commit, date, CPU) written beside every measurement. Nothing here knows a claim:
:mod:`bench.claim_v_timing` and :mod:`bench.claims_je_timing` decide which functions are timed
under which stage.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import platform
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 ** 2


def parse_bytes(text: str) -> int:
    """'512M', '2G', '1.5G', '300000' → bytes (binary units; :func:`fixtures.plugin.preflight.size_bytes`)."""
    from fixtures.plugin.preflight import size_bytes

    try:
        return size_bytes(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"cannot read a memory size from {text!r}; "
                                         "write e.g. 512M or 2G") from None


class RssSampler:
    """Peak resident set size inside ``with sampler.window() as w:`` blocks (psutil, every 20 ms;
    5 ms sampling was measured to cost up to ~20% wall time on this machine)."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._peak = 0
        self._lock = threading.Lock()  # a window's reset must not be overwritten by a stale max
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return self._proc.memory_info().rss

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss = self.rss()
            with self._lock:
                self._peak = max(self._peak, rss)
            time.sleep(self._interval)

    @contextlib.contextmanager
    def window(self):
        with self._lock:
            rec = {"start": self.rss()}
            self._peak = rec["start"]
        try:
            yield rec
        finally:
            end = self.rss()
            with self._lock:
                rec["peak"], rec["end"] = max(self._peak, end), end

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Timers:
    """Accumulated wall and CPU seconds per stage name, fed by the wrappers of :func:`bench_model`.

    Stages are *exclusive*: when a wrapped function calls another wrapped one on the same thread
    (KeyGram's eigensolver inside the metrics, the Lanczos threshold inside γ), the inner call's
    time counts under its own stage only. CPU times are per thread (``time.thread_time``).
    """

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._lock = threading.Lock()  # the assignment runs in the session's second thread
        self._local = threading.local()

    def add(self, name: str, wall: float, cpu: float) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append([0.0, 0.0])  # time of nested wrapped calls
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                inner_w, inner_c = stack.pop()
                if stack:
                    stack[-1][0] += wall
                    stack[-1][1] += cpu
                with self._lock:
                    self.add(name, wall - inner_w, cpu - inner_c)
                    if threading.current_thread() is threading.main_thread():
                        self.add(name + "@main", wall - inner_w, cpu - inner_c)
        return timed



class StageClock:
    """Wall-clock and CPU seconds the loop references (:mod:`bench.loop_reference`) spend in named
    stages, accumulated over calls.

    ``with clock.stage("eigen"): ...`` adds the block's time to ``wall["eigen"]`` and
    ``cpu["eigen"]``. Stages must not nest.
    """

    def __init__(self) -> None:
        self.wall: dict[str, float] = collections.defaultdict(float)
        self.cpu: dict[str, float] = collections.defaultdict(float)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] += time.perf_counter() - w0
            self.cpu[name] += time.process_time() - c0


@contextlib.contextmanager
def no_clock(name: str) -> Iterator[None]:
    """The stand-in for :meth:`StageClock.stage` when nothing is timed."""
    yield

@contextlib.contextmanager
def patched(targets: list[tuple[Any, str, Callable]]):
    """Replace ``getattr(obj, name)`` by ``make(original)`` for each target; restore on exit."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    try:
        for (obj, name, make), (_, _, orig) in zip(targets, saved):
            setattr(obj, name, make(orig))
        yield
    finally:
        for obj, name, orig in saved:
            setattr(obj, name, orig)


def set_threads(n: int) -> dict:
    """torch intra-op threads and every BLAS/OpenMP pool (threadpoolctl) set to ``n``.

    threadpoolctl only limits libraries already loaded: scipy's own OpenBLAS is loaded first.
    """
    # Imported for their side effect only (the native libraries they load, and the thread pools
    # those bring, exist before threadpool_limits): scipy.linalg (BLAS/LAPACK), scipy.optimize
    # (the assignment), scipy.spatial (bench.loop_reference_metrics' pdist).
    import scipy.linalg  # noqa: F401
    import scipy.optimize  # noqa: F401
    import scipy.spatial  # noqa: F401

    torch.set_num_threads(n)
    info = {"torch": n}
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
        info["blas_pools"] = n
    except ImportError:
        info["blas_pools"] = "threadpoolctl missing: numpy's BLAS pool left as is"
    return info


def provenance() -> dict:
    """The commit measured (``-dirty`` when the work tree differs), the UTC date, and how many
    times each model was run (one: every number is a single run)."""
    import subprocess

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    return {"commit": commit, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "repeats": 1}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: The Gram and eigen stages claims V and E share: (module, function) → stage. KeyGram calls
#: checks.gram's names (top_eigh imported from checks.topk), top_eigh's full path checks.topk's
#: sorted_eigh: both names are wrapped where they are looked up.
GRAM_STAGES = {**{("checks.gram", name): "gram"
                  for name in ("score_matrix", "log_normaliser", "center_gram",
                               "undetermined_threshold")},
               **{key: "eigen" for key in (("checks.gram", "sorted_eigh"),
                                           ("checks.gram", "sorted_eigvalsh"),
                                           ("checks.gram", "top_eigh"), ("checks.topk", "top_eigh"),
                                           ("checks.topk", "sorted_eigh"))}}
SMALL = 1e-3  # below this magnitude the agreement check is absolute (rtol · SMALL)


def tracking_groups(state: dict) -> Callable:
    """A ``make`` for :func:`patched` on ``(run, "_groups")``: the wrapper of ``run._groups`` notes,
    in ``state``, the layer, samples and heads of the batch being computed (and every batch's
    sample count under ``"chunks"``), so the recorders can key what the session's math saw by
    (sample, layer, head)."""
    def make(orig_groups):
        def groups(layer):
            for item in orig_groups(layer):
                state["layer"], state["chunk"], state["heads"] = layer, list(item[0]), item[1]
                state.setdefault("chunks", []).append(len(item[0]))
                yield item
        return groups
    return make


def time_layers(run, claim: str, layers: list[int], targets: list, timers: Timers, sampler,
                total: str, label: str = "") -> tuple[dict, dict]:
    """``run.layer_metrics(claim, layer)`` for every layer with ``targets`` patched (:func:`patched`),
    inside one memory window; the whole loop's wall and process CPU time (both threads) is added
    to ``timers`` under ``total``. Returns (metrics by layer, the memory window)."""
    per_layer = {}
    with sampler.window() as mem, patched(targets):
        w0, c0 = time.perf_counter(), time.process_time()  # process: both threads
        for layer in layers:
            t = time.perf_counter()
            per_layer[layer] = run.layer_metrics(claim, layer)
            print(f"   {label}L{layer:02d}: {time.perf_counter() - t:6.1f} s", flush=True)
        timers.add(total, time.perf_counter() - w0, time.process_time() - c0)
    return per_layer, mem
