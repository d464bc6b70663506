"""Headless Chromium for the report's layout tests (tests/test_report_layout.py,
tests/test_report_first_screen.py): where the binary is, and one run of it on a page."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

#: A headless, quiet, offline Chromium: no first-run screens, no background fetches, no scrollbars
#: (so a 1400 px window lays the page out 1400 px wide).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", "--hide-scrollbars"]


def chromium() -> str | None:
    """Debian's Chromium, or None where it is not installed (the tests then skip)."""
    candidates = (shutil.which("chromium"), "/usr/bin/chromium")
    return next((p for p in candidates if p and Path(p).exists()), None)


def run(binary: str, profile: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    """One headless Chromium run on ``url`` with its own profile folder."""
    return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=180)
