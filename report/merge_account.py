"""What one input of ``python -m report merge`` must hold on its own (:func:`check_accounted`),
and the merge's error (:class:`MergeError`), shared by :mod:`report.merge` and
:mod:`report.merge_layers`."""

from __future__ import annotations

import json

from .summary import summary


class MergeError(ValueError):
    """The inputs cannot be merged; the message is one sentence naming the field."""


def check_accounted(name: str, data: dict) -> None:
    """A shard's own account of its tests must hold together; what it may say and what it may not.

    Accepted, as a partial input the merge names: a shard that says it ended early
    (``complete: false``, with ``interrupted_by``, ``errors`` or the tests it did not reach under
    ``not_run``), whatever number of records it has, none included. Refused: a test the shard ran
    (its ``durations``, one entry per reported test) with no record, no ``skipped`` reason and no
    ``not_run`` entry, or a record of a test it did not run; ``complete: true`` beside tests that
    did not run, faults or a SIGTERM; a ``summary`` whose counts its records and ``not_run`` do
    not give (a record removed, added or altered by hand, or a file cut short)."""
    durations = data.get("durations") or {}  # none: a results.json of an earlier version
    recorded = {str(r.get("test_id")) for r in data["records"]}
    accounted = set(data["not_run"]) | set(data.get("skipped") or {})
    missing = sorted(t for t in durations
                     if t not in accounted and t.split("::")[-1] not in recorded)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        hint = ("" if "skipped" in data else
                "; it has no 'skipped' list, so a test skipped by its model family cannot be told "
                "from a lost record: rerun that shard with this version")
        raise MergeError(f"{name} lists {missing[0]}{more} under durations (it ran) but holds no "
                         f"record of it, nor lists it under not_run or skipped: a record was "
                         f"removed or the file is damaged; rerun that shard{hint}")
    orphans = sorted(str(r.get("test_id")) for r in data["records"]
                     if durations and not any(t.split("::")[-1] == r.get("test_id")
                                              for t in durations))
    if orphans:
        raise MergeError(f"{name} holds a record of {orphans[0]}, a test its durations do not "
                         "list (it did not run in that shard): a record was added or copied from "
                         "another file; rerun that shard")
    if data["complete"]:
        said = (f"{len(data['not_run'])} tests under not_run" if data["not_run"] else
                f"{len(data['errors'])} faults under errors" if data.get("errors") else
                f"interrupted_by {data['interrupted_by']!r}" if data.get("interrupted_by") else None)
        if said:
            raise MergeError(f"{name} says complete: true but lists {said}: a hand-edited or "
                             "damaged shard; rerun that shard")
    stated = data.get("summary")
    if isinstance(stated, dict):
        counted = summary(data["records"], data["not_run"])
        for key in ("records", "not_run", "verdicts", "outcomes"):
            if key in stated and stated[key] != counted[key]:
                raise MergeError(
                    f"{name} states summary.{key} {json.dumps(stated[key], sort_keys=True)} but its "
                    f"records and not_run give {json.dumps(counted[key], sort_keys=True)}: a record "
                    "was removed, added or altered by hand, or the file is damaged; rerun that shard")
