"""``python -m report RESULTS [-o OUT.html]``: re-render the report from an existing results.json.

``python -m report merge A/results.json B/results.json … -o OUT/``: join the results of the
shards of one run (``--shard K/N``) into OUT/results.json and OUT/report.html (report/merge.py);
exit 4 with one sentence, nothing written, when the inputs are not shards of one run.

``python -m report diff RUN/results.json REFERENCE/results.json``: whether a run reproduces a
reference run (report/diff.py): exit 0 it does, 6 a verdict or a number outside its tolerance
changed, 4 the two are not comparable (other options, models, checkpoints or selection).

Prints the written path. Exit status 2, with one sentence on stderr, when the results file is
missing or malformed (parsed strictly and validated against docs/results.schema.json:
report/validate.py); 4 when the output is the results file itself, a folder, or a FIFO, socket or
device (nothing is written then). Names in messages are printable (terminal escape codes
written as ``\x1b``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from checks._validation import printable

from .render import write_report


def merge_main(argv: list[str]) -> int:
    from .merge import MergeError, merge_files

    parser = argparse.ArgumentParser(
        prog="python -m report merge",
        description="Merge the results.json files of the shards of one run (pytest claims/ "
                    "--shard K/N) into one results.json and report.html.")
    parser.add_argument("results", type=Path, nargs="+", help="the results.json of each shard")
    parser.add_argument("-o", "--out", type=Path, required=True,
                        help="the folder to write results.json and report.html into")
    args = parser.parse_args(argv)
    command = " ".join(["python -m report merge", *argv])
    try:
        results, report, merged = merge_files(args.results, args.out, command)
    except MergeError as exc:
        parser.exit(4, printable(f"{parser.prog}: error: {exc}") + "\n")
    except OSError as exc:
        parser.exit(4, printable(f"{parser.prog}: error: cannot write into {args.out} "
                                 f"({exc.strerror or exc})") + "\n")
    from .partial import partial_reasons

    print(printable(results))
    print(printable(report))
    if not merged["complete"]:
        print("partial merge (complete: false): " + "; ".join(partial_reasons(merged)),
              file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    if argv[:1] == ["reference"]:
        from .reference import main as reference_main
        return reference_main(argv[1:])
    if argv[:1] == ["diff"]:
        from .diff import main as diff_main
        return diff_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m report",
        description="Render the kpca-claims HTML reproducibility report from a results.json.")
    parser.add_argument("results", type=Path, help="a results.json written by `pytest claims/`")
    parser.add_argument("-o", "--out", type=Path, default=None,
                        help="the HTML file to write (default: report.html beside RESULTS)")
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else args.results.with_name("report.html")

    def refuse(status: int, sentence: str):
        parser.exit(status, printable(f"{parser.prog}: error: {sentence}") + "\n")

    if out.resolve() == args.results.resolve():  # never overwrite the input
        refuse(4, f"the output {out} is the results file itself; give another path with -o")
    if out.is_dir():
        refuse(4, f"the output {out} is a folder; give a file path with -o, e.g. -o report.html")
    if out.exists() and not out.is_file():  # a FIFO, a socket, a device: never replaced
        refuse(4, f"the output {out} is not a regular file (a FIFO, a socket or a device), and "
                  "writing would replace it; give the path of a regular file or a new one with -o")
    try:
        written = write_report(args.results, out)
    except ValueError as exc:
        refuse(2, str(exc))
    except OSError as exc:
        refuse(2, f"cannot write {out} ({exc.strerror or exc}); nothing was written")
    print(printable(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
