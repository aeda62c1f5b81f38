"""The option reference (``docs/options.md``), generated from the option table so it cannot
drift from the command line and the job file. A test compares the file with ``render()``;
regenerate it with::

    python -m phalanx.cli.optdocs > docs/options.md
"""

from __future__ import annotations

from ..core.options import GROUPS, Option, default_first

HEADER = """# Options of `phalanx run` and of job files

Generated from `src/phalanx/core/options.py` (and each backend's options module) by
`python -m phalanx.cli.optdocs > docs/options.md`; a test fails when this page is stale.

Every option can be given on the command line (before the script: everything after the script, or
after `-m MODULE`, belongs to the script) and, where a key is shown, in a job file (`-f job.yaml`);
the command line wins. Both are checked the same way: `--max-retries three` and `max_retries: three`
fail alike, with the flag or the file, line and key in the message. In a job file a value is read as
typed: `name: 010` is the text `010`, `time: 4:00:00` is `4:00:00`, and a boolean is `true` or
`false` without quotes (`"false"` is an error, never read as true). A list may be written as a
string where the table says so: `args: "--lr 0.1"` is split like a shell into two arguments.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flags(option: Option) -> str:
    metavar = f" {option.shown_metavar}" if option.takes_value and option.shown_metavar else ""
    return _cell(", ".join(f"`{flag}{metavar if i == 0 else ''}`" for i, flag in enumerate(option.flags)) or "—")


def _row(option: Option) -> str:
    from ..backends.builtin import BACKENDS

    key = f"`{option.file_key}`" if option.file_key else "—"
    backends = ", ".join(option.backends) or "all"
    meaning = option.help.replace("{backends}", ", ".join(sorted(BACKENDS)))
    written, meaning = (None, meaning) if option.expands else default_first(meaning)
    default = f"`{option.default_text()}`" if option.default_text() and not option.default_doc else option.default_doc
    return f"| {_flags(option)} | {key} | {_cell(meaning)} | {_cell(default or written or '')} | {backends} |"


def render() -> str:
    from ..jobfile.values import all_options

    options = all_options()
    lines = [HEADER]
    for group, title in GROUPS.items():
        members = [o for o in options if o.group == group]
        if not members:
            continue
        lines += [f"## {title}", "", "| flags | job-file key | meaning | default | backends |", "|---|---|---|---|---|"]
        lines += [_row(o) for o in members]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
