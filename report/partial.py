"""Why a merge of shards is partial, in sentences: shards that left no results, shards that were
cut short (a time limit, ``scancel``, a fault), tests that did not run, faults. The merge's own
log line (``python -m report merge``) and the merged report's summary banner both say it."""

from __future__ import annotations


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _ended(entry: dict) -> str:
    """How an input of a merge ended, from its ``merged_from`` entry."""
    by, status = entry.get("interrupted_by"), entry.get("exit_status")
    if by == "SIGTERM":
        how = "was stopped by SIGTERM (a job time limit or scancel)"
    elif status == 2:
        how = "was interrupted (exit status 2)"
    elif status is not None and status not in (0, 1):
        how = f"ended with exit status {status}"
    else:
        how = "did not complete"
    left = entry.get("not_run") or 0
    return how + (f"; {_plural(left, 'claim test')} of it did not run" if left else "")


def declared_models(results: dict) -> list[str]:
    """The models the run declared (a merge's or a shard's), beside those that left results."""
    prov = results.get("provenance") or {}
    shard = prov.get("shard") or {}
    return sorted(set(prov.get("declared_models") or []) | set(shard.get("declared_models") or []))


def partial_reasons(results: dict, count_not_run: bool = True) -> list[str]:
    """One sentence per reason the results are not complete (empty for a complete run);
    ``count_not_run``: with the number of tests that did not run (the report says it apart)."""
    prov = results.get("provenance") or {}
    out: list[str] = []
    missing_models = prov.get("missing_models") or []
    count = prov.get("shard_count")
    missing_shards = prov.get("missing_shards") or []
    if missing_shards:
        shards = ", ".join(f"{k}/{count}" for k in missing_shards)
        out.append(f"{'Shard' if len(missing_shards) == 1 else 'Shards'} {shards} left no "
                   "results.json (the job failed, was cancelled or was not given to the merge)"
                   + (f": no results for {', '.join(missing_models)}" if missing_models else ""))
    elif missing_models:
        out.append(f"No input holds the models {', '.join(missing_models)} of the declared run")
    for entry in prov.get("merged_from") or []:
        if not entry.get("complete", True):
            what = f"Shard {entry['shard']}" if entry.get("shard") else f"Input {entry.get('file')}"
            out.append(f"{what} ({entry.get('file')}) {_ended(entry)}")
    errors = results.get("errors") or []
    if errors:
        out.append(f"{_plural(len(errors), 'fault')} (not verdicts): the first, "
                   f"{errors[0].get('kind')} fault {errors[0].get('error')}")
    not_run = results.get("not_run") or []
    if not_run and count_not_run:
        out.append(f"{_plural(len(not_run), 'collected claim test')} did not run")
    if not out and not results.get("complete", True):
        out.append("The run did not complete")
    return out
