"""Every results.json, baseline and shard file the project reads is checked here, by type and range,
before it is used: JSON that Python's ``json`` module accepts but JSON cannot carry (``NaN``,
``Infinity``, ``1e999``, a 401-digit integer) is refused as it is parsed, then the object is
validated against ``docs/results.schema.json`` (finite numbers, the ranges of the metrics, record
types). A failure is one sentence naming the file, the place inside it and what is wrong
(:class:`InvalidFile`, a ValueError); the callers turn it into their exit code (4 for the files a
``pytest claims/`` run is given, 2 for ``python -m report``, 4 for ``python -m report merge``).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = CHECKOUT / "docs" / "results.schema.json"
#: float64's largest finite value: JSON numbers beyond it become inf in Python
FLOAT_MAX = 1.7976931348623157e308


class InvalidFile(ValueError):
    """A results, baseline or shard file that cannot be used; the message is one sentence."""


class _NotFinite(ValueError):
    pass


def _constant(token: str):
    raise _NotFinite(f"the non-standard JSON constant {token}")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"the number {text}, beyond the range of a float64")
    return value


def _int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > 309:  # more digits than any float64 has; int() itself stops at 4300
        raise _NotFinite(f"a {len(digits)}-digit integer, beyond the range of a float64")
    value = int(text)
    if abs(value) > FLOAT_MAX:
        raise _NotFinite(f"the integer {text[:12]}…, beyond the range of a float64")
    return value


def parse_json(text: str, name: str) -> object:
    """``text`` as strict JSON: no NaN/Infinity constants and no number beyond float64's range
    (what the project writes with ``allow_nan=False``); InvalidFile naming ``name`` otherwise."""
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _NotFinite as exc:
        raise InvalidFile(f"{name} holds {exc}: every number of these files is finite (a "
                          "non-finite value is written as the string \"nan\", \"inf\" or "
                          "\"-inf\")") from None
    except json.JSONDecodeError as exc:
        raise InvalidFile(f"{name} is not valid JSON ({exc.msg} at line {exc.lineno}, column "
                          f"{exc.colno}): a truncated or hand-edited file?") from None
    except RecursionError:
        raise InvalidFile(f"{name} is nested too deeply to be a results or baseline file") from None


def read_json(path: str | Path, what: str = "file") -> object:
    """Read and :func:`parse_json` ``path``; InvalidFile with one sentence when it cannot."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidFile(f"{name} does not exist") from None
    except IsADirectoryError:
        raise InvalidFile(f"{name} is a folder, not a file") from None
    except UnicodeDecodeError as exc:
        raise InvalidFile(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InvalidFile(f"{name} cannot be read ({exc.strerror or exc})") from None
    return parse_json(text, name)


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    inlined = _inline_refs(schema(), schema()["$defs"])
    cls = jsonschema.validators.validator_for(inlined)
    return cls(inlined, format_checker=None)


#: Keywords beside a ``$ref`` that only annotate (dropped where the reference is inlined).
_ANNOTATIONS = ("description", "title", "$comment")


def _inline_refs(node, defs: dict):
    """``node`` with every local reference ``{"$ref": "#/$defs/NAME"}`` replaced by that
    definition, itself inlined (the schema's definitions do not refer to themselves). The same
    validation without resolving 94,000 references for a full results.json: 3.0 -> 1.25 CPU s
    for reference/results.json on this Xeon. Keywords beside a reference may only annotate."""
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        extra = set(node) - {"$ref", *_ANNOTATIONS}
        if extra:
            raise ValueError(f"docs/results.schema.json: {sorted(extra)} beside {ref}: only "
                             f"{', '.join(_ANNOTATIONS)} may stand beside a reference")
        return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
    return {key: (value if key == "$defs" else _inline_refs(value, defs))
            for key, value in node.items()}


def _where(error) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the top level"


def _short(value) -> str:
    text = json.dumps(value, allow_nan=True, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(error) -> str:
    """One clause for a schema error: the value and what it should have been."""
    sub = error.schema if isinstance(error.schema, dict) else {}
    if error.validator in ("anyOf", "oneOf") and sub.get("description"):
        return f"is {_short(error.instance)}, not {sub['description']}"
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        lo, hi = sub.get("minimum"), sub.get("maximum")
        bounds = (f"in [{lo:g}, {hi:g}]" if lo is not None and hi is not None else
                  f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        return f"is {_short(error.instance)}, outside its range (it must be {bounds})"
    if error.validator == "required":
        return error.message.replace("is a required property", "is missing")
    if error.validator == "type":
        want = sub.get("type")
        want = " or ".join(want) if isinstance(want, list) else want
        return f"is {_short(error.instance)}, not of type {want}"
    return error.message if len(error.message) <= 160 else error.message[:157] + "..."


def _deepest(error):
    """The most specific of an anyOf's errors when one branch clearly fits better (a number
    that is out of range rather than 'not a string')."""
    if error.validator in ("anyOf", "oneOf") and error.context:
        ranged = [e for e in error.context
                  if e.validator in ("minimum", "maximum", "required", "additionalProperties",
                                     "minItems", "maxItems")]
        if ranged:
            return _deepest(ranged[0])
        if not (isinstance(error.schema, dict) and error.schema.get("description")):
            import jsonschema

            return _deepest(jsonschema.exceptions.best_match(error.context))
    return error


def require_object(data: object, name: str) -> dict:
    """``data`` when it is a JSON object; InvalidFile naming what it is otherwise."""
    if not isinstance(data, dict):
        raise InvalidFile(f"{name} holds a JSON {type(data).__name__} ({_short(data)}), not an "
                          "object: it is not a kpca-claims results or baseline file")
    return data


def check(data: object, name: str, expect: str | None = None) -> dict:
    """Validate ``data`` (parsed from the file ``name``) against docs/results.schema.json;
    ``expect`` ("results" or "baseline") also requires that kind of file. Returns ``data``."""
    require_object(data, name)
    tags = {"results": "kpca-claims/results/1", "baseline": "kpca-claims/baseline/2"}
    if expect is not None and data.get("schema") != tags[expect]:
        raise InvalidFile(f"{name} is not a kpca-claims {expect} file (schema "
                          f"{_short(data.get('schema'))}, expected {tags[expect]!r})")
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
    if error is not None:
        error = _deepest(error)
        raise InvalidFile(f"{name} does not fit docs/results.schema.json: {_where(error)} "
                          f"{_reason(error)}")
    return data


def load(path: str | Path, what: str, expect: str | None = None) -> dict:
    """Read, parse strictly and validate a results or baseline file (``what`` names it in the
    message: "baseline", "results file", "shard")."""
    return check(read_json(path, what), f"{what} {path}", expect)
