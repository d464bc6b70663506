"""Stage attribution for ``python -m bench.run --pipeline``: which stage of the real per-model
pipeline of ``pytest claims/`` spends the CPU time, measured from the outside.

:class:`Attribution` wraps functions with timers that charge each call's *exclusive* per-thread CPU
time (``time.thread_time``) and wall time to a stage: a wrapped call inside another counts under
its own stage only, so every second is counted once and the stages add up to what the wrapped calls
took. Two refinements:

* an *absorbing* stage (a round-off twin, claim J's output fit, the trend over checkpoints) keeps
  everything nested inside it, whatever its own stage: its total is the whole cost of that work,
  and the nested stages are kept apart as its *detail* (``"J trend checkpoints > capture"``);
* a *shared* stage (an eigensolver, the Gram matrices) is labelled by the claim it runs for, taken
  from the nearest enclosing call that names one (``"eigendecompositions (V)"``).

:func:`patch_everywhere` puts the wrappers in place by replacing the function object under every
name it is known by in the project's loaded modules (``from checks.stats import bootstrap_weights``
binds a second name to the same function; callers look the name up where they call it), and
restores every name on exit. Nothing here knows the pipeline: :mod:`bench.pipeline` says which
functions are which stage.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

#: The project's packages whose modules are searched for names to patch.
PROJECT_PACKAGES = ("checks", "claims", "fixtures", "report")


@dataclass(frozen=True)
class Stage:
    """One wrapped function: ``target`` is ``"module:function"`` or ``"module:Class.method"``;
    ``stage`` is its label, or a callable ``(args, kwargs) → (label, claim)`` deciding per call;
    ``claim`` the claim it runs for (inherited by nested calls); ``absorb``: nested calls are
    charged here (kept apart as detail); ``shared``: the label gets the enclosing claim,
    ``"label (V)"``."""

    target: str
    stage: str | Callable[[tuple, dict], tuple[str, str | None]]
    claim: str | None = None
    absorb: bool = False
    shared: bool = False


class _Frame:
    __slots__ = ("charge", "claim", "absorb", "detail", "inner_cpu", "inner_wall")

    def __init__(self, charge, claim, absorb, detail):
        self.charge, self.claim, self.absorb, self.detail = charge, claim, absorb, detail
        self.inner_cpu = self.inner_wall = 0.0


class Attribution:
    """Exclusive CPU and wall seconds and call counts per stage, from every thread."""

    def __init__(self, cpu_clock: Callable[[], float] = time.thread_time,
                 wall_clock: Callable[[], float] = time.perf_counter) -> None:
        self._cpu_clock, self._wall_clock = cpu_clock, wall_clock  # injectable for tests
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.detail_cpu: dict[str, float] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def _stack(self) -> list[_Frame]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _enter(self, label: str, claim: str | None, absorb: bool, shared: bool) -> _Frame:
        stack = self._stack()
        parent = stack[-1] if stack else None
        claim = claim or (parent.claim if parent else None)
        own = f"{label} ({claim})" if shared and claim else label
        outer = parent.absorb if parent else None
        absorbing = outer or (own if absorb else None)
        detail = f"{absorbing} > {own if own != absorbing else '(itself)'}" if absorbing else None
        frame = _Frame(absorbing or own, claim, absorbing, detail)
        stack.append(frame)
        return frame

    def _leave(self, frame: _Frame, cpu: float, wall: float) -> None:
        stack = self._stack()
        stack.pop()
        if stack:
            stack[-1].inner_cpu += cpu
            stack[-1].inner_wall += wall
        own_cpu, own_wall = cpu - frame.inner_cpu, wall - frame.inner_wall
        with self._lock:
            self.cpu[frame.charge] = self.cpu.get(frame.charge, 0.0) + own_cpu
            self.wall[frame.charge] = self.wall.get(frame.charge, 0.0) + own_wall
            if frame.detail is None or frame.detail.endswith("(itself)"):  # not an absorbed call
                self.calls[frame.charge] = self.calls.get(frame.charge, 0) + 1
            if frame.detail:
                self.detail_cpu[frame.detail] = self.detail_cpu.get(frame.detail, 0.0) + own_cpu

    @contextlib.contextmanager
    def stage(self, label: str, claim: str | None = None, absorb: bool = False,
              shared: bool = False) -> Iterator[None]:
        """Time a block as a call of stage ``label`` (pytest's phases, a test's fake stages)."""
        frame = self._enter(label, claim, absorb, shared)
        c0, w0 = self._cpu_clock(), self._wall_clock()
        try:
            yield
        finally:
            self._leave(frame, self._cpu_clock() - c0, self._wall_clock() - w0)

    def wrap(self, spec: Stage, fn: Callable) -> Callable:
        """``fn`` timed as ``spec`` says (exclusive, per thread)."""
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if callable(spec.stage):
                label, claim = spec.stage(args, kwargs)
            else:
                label, claim = spec.stage, spec.claim
            with self.stage(label, claim, spec.absorb, spec.shared):
                return fn(*args, **kwargs)
        timed.__bench_wrapped__ = fn
        return timed

    def totals(self) -> dict:
        """Everything measured, rounded for JSON."""
        def r(d):
            return {k: round(v, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}
        return {"cpu_s": r(self.cpu), "wall_s": r(self.wall), "calls": dict(self.calls),
                "detail_cpu_s": r(self.detail_cpu)}


def _resolve(target: str) -> tuple[Any, str, Any]:
    """``"mod:fn"`` → (module, "fn", function); ``"mod:Cls.meth"`` → (class, "meth", function)."""
    module, _, qual = target.partition(":")
    owner: Any = importlib.import_module(module)
    *path, name = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    if isinstance(owner, type):
        return owner, name, owner.__dict__[name]
    return owner, name, getattr(owner, name)


def _project_modules(packages: tuple[str, ...]) -> list[Any]:
    return [m for name, m in list(sys.modules.items())
            if m is not None and name.split(".")[0] in packages]


class Patches:
    """The wrappers of :func:`patch_everywhere`: ``apply()`` (again after new imports: only names
    still bound to an original are replaced) and ``restore()``."""

    def __init__(self, attribution: Attribution, stages: list[Stage],
                 packages: tuple[str, ...] = PROJECT_PACKAGES):
        self.attribution, self.packages = attribution, packages
        self.originals: dict[int, tuple[Any, Callable]] = {}  # id(original) → (original, wrapper)
        self.replaced: list[tuple[Any, str, Any]] = []
        self.missing: list[str] = []
        self.class_targets: list[tuple[type, str, Any]] = []
        for spec in stages:
            try:
                owner, name, orig = _resolve(spec.target)
            except (ImportError, AttributeError, KeyError) as exc:
                self.missing.append(f"{spec.target} ({type(exc).__name__}: {exc})")
                continue
            if id(orig) in self.originals:
                continue  # two names of one function: the first stage given wins
            self.originals[id(orig)] = (orig, self.attribution.wrap(spec, orig))
            if isinstance(owner, type):
                self.class_targets.append((owner, name, orig))

    def apply(self) -> int:
        """Replace every name bound to an original; returns how many names were replaced."""
        n = 0
        for owner, name, orig in self.class_targets:
            if owner.__dict__.get(name) is orig:
                self.replaced.append((owner, name, orig))
                setattr(owner, name, self.originals[id(orig)][1])
                n += 1
        for module in _project_modules(self.packages):
            for name, value in list(vars(module).items()):
                hit = self.originals.get(id(value))
                if hit is not None and hit[0] is value:
                    self.replaced.append((module, name, value))
                    setattr(module, name, hit[1])
                    n += 1
        return n

    def restore(self) -> None:
        for owner, name, orig in reversed(self.replaced):
            setattr(owner, name, orig)
        self.replaced.clear()

    def names(self) -> list[str]:
        """Where each wrapper sits, ``module.name`` (for the results file)."""
        return sorted({f"{getattr(o, '__module__', '') + '.' if isinstance(o, type) else ''}"
                       f"{getattr(o, '__qualname__', None) or o.__name__}.{n}"
                       for o, n, _ in self.replaced})


@contextlib.contextmanager
def patch_everywhere(attribution: Attribution, stages: list[Stage],
                     packages: tuple[str, ...] = PROJECT_PACKAGES) -> Iterator[Patches]:
    """Wrap every function of ``stages`` under every name the loaded modules of ``packages`` bind
    it to (and class attributes for methods), for the duration of the block."""
    patches = Patches(attribution, stages, packages)
    patches.apply()
    try:
        yield patches
    finally:
        patches.restore()
