"""Are a run's models the shipped reference's models? One line for each that is not.

``report diff`` can only say REPRODUCES for a run whose models have the weights of the shipped
reference (``reference/results.json``, its ``models.<key>.checkpoint_hash``). A run on other
weights — a default model whose files are not the shipped ones, a user's checkpoint or hub
model, a tiny ViT trained on this machine — says so while it runs, not only when a diff says
NOT COMPARABLE afterwards. :func:`assess` compares each model of a run with the reference's
model of the same name (:data:`STATUSES`); results.json keeps the outcome as
``models.<key>.reference_weights`` (docs/results.schema.json); for the statuses of
:data:`SAID` the terminal prints the sentence when the model's first record arrives and again
among the closing lines, and the report shows it at its top. A catalogue model outside the
default selection whose weights are the same on any machine (built from a seed, packaged) gets
no line: nothing about it is unexpected.
"""

from __future__ import annotations

import json
from pathlib import Path

from .reference import REFERENCE

#: ``status`` values: the reference's weights; other weights under a name of the reference;
#: weights from outside the project (a checkpoint file, a hub model) not in the reference;
#: a model trained on this machine not in the reference; the project's own machine-independent
#: weights of a catalogue model the reference does not hold (built from a seed, packaged, the
#: shipped files); nothing to compare (no reference file, no hash).
STATUSES = ("reference", "other", "user", "trained", "own", "unknown")
#: The statuses that get a line: the weights are not the reference's, and a diff against it
#: cannot say REPRODUCES for a reason the user may not expect.
SAID = ("other", "user", "trained")


def reference_models(path: Path | None = None) -> dict | None:
    """``{key: checkpoint_hash}`` of the shipped reference, or None when it cannot be read."""
    try:
        data = json.loads(Path(path or REFERENCE).read_text())
        return {k: m.get("checkpoint_hash") for k, m in (data.get("models") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return None


def origin_words(model: dict) -> str:
    """Where a model's weights came from, in a few words (from its results.json entry)."""
    source, arch = model.get("source"), model.get("arch")
    training = model.get("training") or {}
    if source == "trained":
        if training.get("origin") == "shipped":
            return "the shipped weights of fixtures/data/trained"
        where = "trained on this machine"
        if training.get("reference") == "differs":
            steps = training.get("differing_steps") or []
            where += (f", not reproducing the shipped files at steps "
                      f"{', '.join(str(s) for s in steps)}" if steps else
                      ", not reproducing the shipped files")
        return where
    if source == "checkpoint":
        return f"a checkpoint file of --arch {arch}"
    if source == "hub":
        return f"the hub model {arch} at revision {model.get('hub_revision') or 'main'}"
    if source == "random":
        return f"{arch}, randomly initialised"
    if source == "package":
        return f"the weights packaged as {arch}"
    return f"{source} {arch}"


def assess(key: str, model: dict, reference: dict | None) -> dict:
    """``{"status", "sentence"}`` for one model of a run (``reference``: :func:`reference_models`)."""
    got = model.get("checkpoint_hash")
    if reference is None or not got:
        why = "no shipped reference could be read" if reference is None else "it has no hash"
        return {"status": "unknown", "sentence": f"{key}: its weights could not be compared with "
                                                 f"the shipped reference ({why})"}
    if key not in reference:
        source = model.get("source")
        training = model.get("training") or {}
        if source in ("checkpoint", "hub"):
            status = "user"
        elif source == "trained" and training.get("origin") != "shipped":
            status = "trained"
        else:
            return {"status": "own", "sentence": (
                f"{key}: not a model of the shipped reference ({origin_words(model)}, the same "
                f"on any machine)")}
        return {"status": status, "sentence": (
            f"{key}: not a model of the shipped reference ({origin_words(model)}): "
            f"reference/results.json holds no result for it to reproduce")}
    want = reference[key]
    if want == got:
        return {"status": "reference", "sentence": f"{key}: the shipped reference's weights"}
    return {"status": "other", "sentence": (
        f"{key}: other weights than the shipped reference's {key} (checkpoint hash {got[:12]}… "
        f"against {str(want)[:12]}…; {origin_words(model)}): `report diff` against "
        f"reference/results.json will say NOT COMPARABLE")}


def annotate(models: dict, reference: dict | None = None, path: Path | None = None) -> dict:
    """``models`` (a results.json ``models`` dict) with ``reference_weights`` set on each."""
    reference = reference_models(path) if reference is None else reference
    return {key: {**m, "reference_weights": assess(key, m, reference)}
            for key, m in models.items()}


def not_reference(models: dict) -> list[str]:
    """The sentences of the models whose weights are not the reference's (in key order)."""
    return [m["reference_weights"]["sentence"] for _, m in sorted(models.items())
            if (m.get("reference_weights") or {}).get("status") in SAID]
