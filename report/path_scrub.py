"""This module owns how the report names machine paths: relative inside the checkout, else the
file name and its short sha256, so that no machine's folder layout is published; and the scrub of
every plain string of the template context."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from markupsafe import Markup

#: The checkout the report names paths relative to (its partials and method document are in it).
CHECKOUT = Path(__file__).resolve().parent.parent
#: Files larger than this are named without a hash (checkpoints carry theirs).
HASH_LIMIT = 64 * 1024**2
# An absolute POSIX path of at least two components, not inside a URL or a word ("s/layer").
_ABS_PATH = re.compile(r"""(?<![\w/:.~-])/(?:[^\s/<>"'`;,()]+/)+[^\s/<>"'`;,()]*""")


@lru_cache(maxsize=256)
def display_path(path: str) -> str:
    """How the report names a path: relative inside the checkout, the file name and its short
    sha256 outside (so no machine's folder layout is published)."""
    p = Path(path)
    try:
        return p.resolve().relative_to(CHECKOUT).as_posix() or "."
    except (ValueError, OSError, RuntimeError):
        pass
    name = p.name or path
    try:
        if p.is_file() and p.stat().st_size <= HASH_LIMIT:
            import hashlib

            digest = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            return f"{name} (sha256 {digest})"
    except OSError:
        pass
    return name + ("/" if path.endswith("/") or p.is_dir() else "")


def scrub_paths(text: str) -> str:
    """``text`` with every absolute path in it replaced by :func:`display_path`."""
    return _ABS_PATH.sub(lambda m: display_path(m.group(0)), text)


def scrub_context(obj):
    """The template context with absolute paths scrubbed from every plain string (inline SVG and
    other markup is left alone)."""
    if isinstance(obj, Markup):
        return obj
    if isinstance(obj, str):
        return scrub_paths(obj) if "/" in obj else obj
    if isinstance(obj, dict):
        return {k: scrub_context(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub_context(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(scrub_context(v) for v in obj)
    return obj
