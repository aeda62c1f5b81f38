"""The docs say what is true: every setting, command and backend option is documented in the docs
site (docs/, built by tests/unit/test_site.py), the command reference is generated, every
``name.py`` a doc or a docstring names exists, and the README stays a front page whose links hold."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from phalanx import config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "phalanx"

# The page of each built-in backend, where its options are documented.
BACKEND_PAGES = {"local": "local.md", "ssh": "ssh.md", "slurm": "slurm.md", "k8s": "kubernetes.md", "ray": "ray.md",
                 "sagemaker": "sagemaker.md", "skypilot": "skypilot.md"}


def test_every_setting_is_documented():
    page = (DOCS / "settings.md").read_text()
    for setting in config.SETTINGS:
        assert f"| `{setting.key}` | `{setting.env_var}` |" in page, \
            f"document the setting {setting.key} ({setting.env_var}) in a row of docs/settings.md"


def test_command_reference_is_generated_from_the_cli():
    from phalanx.cli.cmddocs import render

    assert (DOCS / "commands.md").read_text() == render(), \
        "docs/commands.md is stale: python -m phalanx.cli.cmddocs > docs/commands.md"


def test_every_command_is_in_the_command_reference():
    import click

    from phalanx.cli.main import _command

    page = (DOCS / "commands.md").read_text()

    def walk(command: click.Command, path: list[str]) -> None:
        assert f"`{' '.join(path)}`" in page, f"`{' '.join(path)}` is missing from docs/commands.md"
        if isinstance(command, click.Group):
            for name in command.list_commands(click.Context(command)):
                sub = command.get_command(click.Context(command), name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name])
                    for param in sub.params:
                        if isinstance(param, click.Option) and not param.hidden and name != "run":
                            assert all(f"{flag}" in page for flag in param.opts), f"{param.opts} of {name}"

    walk(_command(), ["phalanx"])


@pytest.mark.parametrize("backend", sorted(BACKEND_PAGES))
def test_every_backend_option_is_on_its_page(backend):
    from phalanx.backends.options import declared, declared_sections

    page = (DOCS / BACKEND_PAGES[backend]).read_text()
    for option in declared(backend):
        if option.cli:
            assert f"`{option.flag}" in page, f"document {option.flag} in docs/{BACKEND_PAGES[backend]}"
    for section in declared_sections(backend):
        assert f"{section.key}:" in page, f"show the job file's {section.key}: section in docs/{BACKEND_PAGES[backend]}"


def test_every_backend_has_a_page_in_the_site():
    from phalanx.backends.builtin import BACKENDS

    assert set(BACKENDS) == set(BACKEND_PAGES), "a new built-in backend needs a page (docs/NAME.md) and a row here"
    nav = (ROOT / "mkdocs.yml").read_text()
    readme = (ROOT / "README.md").read_text()
    for backend, page in BACKEND_PAGES.items():
        assert f": {page}" in nav, f"add docs/{page} to the nav in mkdocs.yml"
        assert f"](docs/{page})" in readme and f"| `{backend}`" in readme, f"the README's backends table lacks {backend}"


# -- every name.py that a doc or a docstring names exists --------------------------------------

# A path whose first part is one of these names a file of this repository (``launch/warm/plan.py``,
# ``tests/parallel.py``); other paths (``sky/client/sdk.py``, torch's ``agent/server/api.py``) are
# another project's, and a bare ``train.py`` is the user's script in an example.
_PACKAGES = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("_")}
_SUBPACKAGES = {p.name for p in SRC.glob("*/*") if p.is_dir() and not p.name.startswith("_")}
OURS = _PACKAGES | _SUBPACKAGES | {"phalanx", "src", "tests", "bench", "examples", "docs"}
_MENTION = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b|(?<![\w./-])([\w-]+\.py)\b")


def _repo_files() -> list[str]:
    skip = {".git", ".venv", ".venv-sky", "site", "node_modules", "__pycache__"}
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
            if not skip & set(p.relative_to(ROOT).parts)]


def _docstrings():
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                if text:
                    yield f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", text


def _docs():
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md", ROOT / "bench" / "README.md"]
    for path in pages:
        yield str(path.relative_to(ROOT)), path.read_text()


def missing_files(texts, files: list[str], bare: bool) -> list[str]:
    """Mentions of ``pkg/name.py`` (first part one of ours) that end no file's path, and with
    ``bare``, of ``name.py`` that is no file's name."""
    names = {f.rsplit("/", 1)[-1] for f in files}
    problems = []
    for where, text in texts:
        for match in _MENTION.finditer(text):
            path, name = match.groups()
            if path:
                first, second = (path.split("/") + [""])[:2]
                ours = first in OURS and (first != "src" or second == "phalanx")
                if ours and not any(f == path or f.endswith("/" + path) for f in files):
                    problems.append(f"{where}: {path}")
            elif bare and name not in names:
                problems.append(f"{where}: {name}")
    return problems


def test_every_file_a_doc_or_docstring_names_exists():
    files = _repo_files()
    problems = missing_files(_docs(), files, bare=False) + missing_files(_docstrings(), files, bare=True)
    assert not problems, "these name files that do not exist (renamed or moved?):\n" + "\n".join(problems)


def test_the_check_finds_a_file_that_moved():
    files = ["src/phalanx/launch/warm/plan.py", "src/phalanx/api/jobs.py"]
    texts = [("doc", "see `launch/warm/plan.py` and `launch/warm.py`, `api/jobs.py`, `jobs.py`, "
                     "torch's `agent/server/api.py`, a user's `train.py`"),
             ("docstring", "``query.py`` answers")]
    assert missing_files(texts, files, bare=False) == ["doc: launch/warm.py"]
    assert missing_files(texts[1:], files, bare=True) == ["docstring: query.py"]


# -- the README: a front page whose links hold -------------------------------------------------


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into a page of docs/"


@pytest.mark.parametrize("page", ["README.md", "bench/README.md", "CHANGELOG.md"])
def test_links_of_pages_outside_the_site_hold(page):
    """The site's own links are checked by its strict build; these pages are outside it."""
    path = ROOT / page
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve()
        assert linked.exists(), f"{page} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked.read_text()), f"{page} links to {target}: no such heading"


def _anchors(markdown: str) -> set[str]:
    """Heading ids as MkDocs' toc extension makes them (lower case, punctuation dropped)."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", text))
    return found


def test_every_benchmark_page_is_in_both_indexes():
    pages = sorted(p.name for p in (DOCS / "bench").glob("*.md") if p.name != "index.md")
    index, readme, nav = ((DOCS / "bench" / "index.md").read_text(), (ROOT / "bench" / "README.md").read_text(),
                          (ROOT / "mkdocs.yml").read_text())
    for name in pages:
        assert f"]({name})" in index, f"list docs/bench/{name} in docs/bench/index.md"
        assert f"](../docs/bench/{name})" in readme, f"list docs/bench/{name} in bench/README.md"
        assert f"bench/{name}" in nav, f"add bench/{name} to the nav in mkdocs.yml"
