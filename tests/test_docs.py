"""The docs as issue 43 asks for them: README a front door (at most ``README_MAX_LINES``), every file of
``benchmarks/results/`` (and of its ``experiments/``) indexed in ``benchmarks/results/README.md``,
every results file the docs cite present, no results file named after the session or run that made
it (history lives in git), and no doc citing a folder git ignores (a reader cannot open it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
README_MAX_LINES = 150  # issue 43: what it is, quickstart, use, modes, what is native, where results are

# Names that say when or in which run a file was made, not what it measured: -s21, -s21b, -run1,
# -new1, -old, -w0, a leading date.
RUN_NAME = re.compile(r"-(s\d+[a-z]?|run\d+|new\d*|old|w\d+|after-\d+)(?=[.-])|^\d{4}-\d\d-\d\d-")
BACKTICKED = re.compile(r"`([^`\n]+)`")
CITED_RESULT = re.compile(r"benchmarks/results/([\w.{},/-]+\.(?:md|json|txt|\{[\w,]+\}))")


def _expand(name: str) -> list[str]:
    """``suite.{md,json}`` -> ``suite.md``, ``suite.json``; names without braces as they are."""
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in _expand(name[:m.start()] + alt + name[m.end():])]


def _results_files() -> list[Path]:
    ignored = {"README.md", "models-rows.jsonl"}  # the index itself; the models suite's git-ignored rows
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p.name not in ignored)


def _index_rows() -> list[str]:
    """The first cell of every table row of the index: the file(s) the row is about."""
    cells = [line.split("|")[1].strip() for line in INDEX.read_text().splitlines()
             if line.startswith("| `")]
    return [name for cell in cells for name in BACKTICKED.findall(cell)]


def _ignored_folders() -> list[str]:
    """The folders .gitignore names (``/scratch/``, ``/dumps/``, ...), as a doc would cite them."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    return [line.strip("/") + "/" for line in lines if line.endswith("/") and not line.startswith(("#", "*"))]


def _doc_files() -> list[Path]:
    return [p for p in [*RESULTS.rglob("*.md"), *(REPO / "docs").rglob("*.md"), REPO / "README.md"]]


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; design goes to docs/architecture.md"


def test_every_results_file_is_indexed():
    indexed = {Path(n).name for row in _index_rows() for n in _expand(row)}
    missing = [str(p.relative_to(RESULTS)) for p in _results_files() if p.name not in indexed]
    assert not missing, f"benchmarks/results/README.md has no row for: {missing}"


def test_every_indexed_file_exists():
    present = {p.name for p in _results_files()}
    absent = [n for row in _index_rows() for n in _expand(row) if Path(n).name not in present]
    assert not absent, f"benchmarks/results/README.md indexes files that are not there: {absent}"


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md", "benchmarks/results/README.md",
                                 "benchmarks/results/experiments.md"])
def test_cited_results_files_exist(doc):
    text = (REPO / doc).read_text()
    if doc.startswith("benchmarks/results/"):  # names relative to the folder: `experiments/x.json`, `suite.md`
        names = [n for n in BACKTICKED.findall(text) if re.fullmatch(r"[\w.{},/-]+\.(md|json|txt|\{[\w,]+\})", n)]
    else:
        names = CITED_RESULT.findall(text)
    present = {str(p.relative_to(RESULTS)) for p in _results_files()} | {"README.md"}
    dated = re.compile(r"^\d{4}-\d\d-\d\d-")  # removed runs, cited with the commit that removed them
    absent = sorted({n for name in names for n in _expand(name)
                     if n not in present and Path(n).name not in {Path(p).name for p in present}
                     and not dated.match(Path(n).name) and not n.startswith("corpus-models-")})
    assert not absent, f"{doc} cites results files that are not there: {absent}"


def test_results_files_are_named_by_what_they_measured():
    named_by_run = [str(p.relative_to(RESULTS)) for p in _results_files() if RUN_NAME.search(p.name)]
    assert not named_by_run, f"rename these to what they measured (git keeps the history): {named_by_run}"


def test_no_doc_cites_an_ignored_folder():
    folders = _ignored_folders()
    assert "scratch/" in folders
    citing = []
    for path in _doc_files():
        if path == REPO / "README.md":
            continue  # its quickstart makes `.venv/`; it cites no results
        text = path.read_text()
        for folder in folders:
            # a path that starts with the folder (not `/opt/x/.venv/`, a machine's own path)
            if re.search(r"(?<![\w./-])" + re.escape(folder), text):
                citing.append(f"{path.relative_to(REPO)} cites {folder}")
    assert not citing, citing
