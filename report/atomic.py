"""The one atomic text writer of the project: results.json, report.html, baseline files, merged
shards and the cache's manifests are written to a temporary file in the target folder, flushed to
disk and moved into place with ``os.replace``, so a reader never sees a half-written file and a
failed write leaves none behind. Standard library only; imported by ``report`` and ``fixtures``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` atomically, creating its folder; the
    file gets ``open()``'s usual mode (mkstemp's 0600 would hide a shared report)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
