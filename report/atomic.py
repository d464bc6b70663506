"""The one atomic writer of the project: results.json, report.html, baseline files, samples.jsonl,
merged shards and the cache's manifests are written to a temporary file in the target folder,
flushed to disk and moved into place with ``os.replace``, so a reader never sees a half-written
file and a failed write (a full disk, an interruption) leaves neither the target nor a temporary
file behind. Files get ``open()``'s usual mode (0666 less the umask), not mkstemp's 0600, so a
report or a cache shared through a group stays readable. Standard library only; imported by
``report`` and ``fixtures``."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's umask (read without changing it for longer than a call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | Path, binary: bool = False):
    """``with atomic_open(path) as f: f.write(...)``: a text file (UTF-8, ``\\n`` line ends), or
    with ``binary`` a bytes file, that appears at ``path`` only when the block ends without an
    error; its folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~umask())
        with (os.fdopen(fd, "wb") if binary else
              os.fdopen(fd, "w", encoding="utf-8", newline="\n")) as f:
            fd = None
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, creating its folder."""
    with atomic_open(path, binary=True) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically, creating its folder."""
    with atomic_open(path) as f:
        f.write(text)
    return Path(path)
