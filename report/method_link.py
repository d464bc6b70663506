"""This module owns where the report links "method §N.M": the method document's address
(``$KPCA_METHOD_URL`` when set; else docs/method.md relative to the report's folder when the
report is written inside this checkout; else no address: the reference stays plain text with its
section number, as a link that resolves nowhere helps nobody), which addresses may be an ``href``
of the report at all, and the links themselves."""

from __future__ import annotations

import os
import re
from pathlib import Path

from markupsafe import Markup, escape

from .path_scrub import CHECKOUT

#: The method document the "method §N.M" references of the thresholds' sources link to.
METHOD_DOC = CHECKOUT / "docs" / "method.md"
#: Environment variable: the address the report links "method §N.M" to (a URL of docs/method.md,
#: e.g. on the project's forge); default: the path of docs/method.md relative to the report.
METHOD_URL_ENV = "KPCA_METHOD_URL"
#: The method document relative to the repository root (a report written at the root links it so).
DEFAULT_METHOD_URL = "docs/method.md"

_METHOD_REF = re.compile(r"method §(\d+(?:\.\d+)?)")


def method_links(text: str, method_url: str | None) -> Markup:
    """``text`` (escaped) with every "method §N.M" a link to its anchor ``#sN-M`` of the method
    document at ``method_url``; with no ``method_url``, the reference stays text (its section
    number is in it) and says in its title where the section is."""
    out, last = [], 0
    for m in _METHOD_REF.finditer(text):
        anchor = "s" + m.group(1).replace(".", "-")
        if method_url:
            ref = Markup('<a class="method" href="{}#{}">{}</a>').format(method_url, anchor,
                                                                        m.group(0))
        else:
            ref = Markup('<span class="method" title="section {} of docs/method.md in the '
                         'kpca-claims checkout">{}</span>').format(m.group(1), m.group(0))
        out += [escape(text[last:m.start()]), ref]
        last = m.end()
    return Markup("").join(out + [escape(text[last:])])


def safe_link(url: str) -> bool:
    """Whether ``url`` may be an ``href`` of the report: an http(s) address with a host, or a
    relative reference (a path, ``#anchor`` or ``?query``). Anything else (``javascript:``,
    ``data:``, ``file:``, a scheme-relative ``//host``, control characters or spaces, which
    browsers strip before reading the scheme) is refused."""
    from urllib.parse import urlsplit

    url = str(url)
    if not url or any(ord(c) <= 32 or ord(c) == 127 for c in url) or url.startswith(("//", "\\")):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.scheme:
        return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)
    return ":" not in url.split("/", 1)[0].split("#", 1)[0].split("?", 1)[0]


def method_url_for(out_path=None) -> str | None:
    """Where the report links "method §N.M": ``$KPCA_METHOD_URL`` if set (an address that works
    wherever the report is read); else docs/method.md relative to the report's folder when the
    report is written inside this checkout; else None (a report written elsewhere, or rendered
    without a path: the references stay plain text with their section numbers)."""
    if os.environ.get(METHOD_URL_ENV):
        url = os.environ[METHOD_URL_ENV]
        if safe_link(url):
            return url
        import warnings

        warnings.warn(f"{METHOD_URL_ENV}={url[:80]!r} is neither an http(s) address nor a "
                      "relative path: the report links the method document relative to the "
                      "report inside the checkout, and names its sections without a link elsewhere", UserWarning, stacklevel=2)
    if out_path is not None:
        folder = Path(out_path).resolve().parent
        try:
            folder.relative_to(CHECKOUT)
        except ValueError:
            return None
        return Path(os.path.relpath(METHOD_DOC, folder)).as_posix()
    return None
