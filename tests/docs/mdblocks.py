"""Fenced code blocks of the user-facing docs (README.md, docs/*.md), with where they are.

A block's kind comes from its fence's info string: commands (`sh`, `bash`), Python, SQL and
TOML run in tests/docs/test_docs_blocks.py; `text` (output, diagrams, pseudo-syntax) and
other data formats do not. A fence without a language is an error: the runner could not
tell a command from an output sample. An HTML comment on the line before the fence,
`<!-- docs-test: skip (REASON) -->`, marks a block that cannot run here; the reason is
what the test reports. `<!-- docs-test: slow (REASON) -->` moves a costly block out of the
default run into the `docs_slow` CI step (it still runs first when a later block needs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHELL = frozenset({"sh", "bash", "shell"})
PYTHON = frozenset({"python", "py"})
SQL = frozenset({"sql"})
TOML = frozenset({"toml"})
# Shown, never run: output samples, diagrams, option syntax, configs for other programs.
DATA = frozenset({"text", "yaml", "json", "jsonl", "svg", "html", "diff"})
RUNNABLE = SHELL | PYTHON | SQL | TOML

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_KINDS = ("skip", "slow")
_WORD = re.compile(r"^(?P<word>\w+)\s*\((?P<reason>.+)\)$")


class MarkError(ValueError):
    """A docs-test comment the runner does not understand."""


@dataclass(frozen=True)
class Block:
    """One fenced block: `line` is the 1-based line of its opening fence."""

    doc: str  # path relative to the repository root: "README.md", "docs/sql.md"
    line: int
    lang: str  # the info string's first word, lower case ("" when there is none)
    text: str  # the content, dedented by the fence's indentation
    skip: str | None  # the reason of a `docs-test: skip (...)` mark, else None
    slow: str | None = None  # the reason of a `docs-test: slow (...)` mark

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str:
        for kind, langs in (("sh", SHELL), ("python", PYTHON), ("sql", SQL), ("toml", TOML)):
            if self.lang in langs:
                return kind
        return "data" if self.lang in DATA else "unknown"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md, so a new page is run as soon as it exists."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """Every fenced block of one markdown file, in document order."""
    doc = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        info = m["info"].strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not _closes(lines[i], fence):
            body.append(_dedent(lines[i], indent))
            i += 1
        lang = info.split()[0].lower() if info else ""
        text = "\n".join(body) + "\n"
        marks = _marks(lines, start, doc)
        out.append(Block(doc, start + 1, lang, text, marks.get("skip"), marks.get("slow")))
        i += 1
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for path in doc_files(root) for b in blocks_of(path, root)]


def _dedent(line: str, indent: int) -> str:
    """Drop the fence's indentation (a fence inside a list item), no more."""
    lead = len(line) - len(line.lstrip(" \t"))
    return line[min(lead, indent) :]


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and set(stripped) == {fence[0]}


def _marks(lines: list[str], fence_index: int, doc: str) -> dict[str, str]:
    """`docs-test:` marks on the non-blank lines right above the fence: {word: reason}."""
    marks: dict[str, str] = {}
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    while j >= 0 and (mark := _MARK.match(lines[j])):
        word = _WORD.match(mark["body"])
        if not word or word["word"] not in _KINDS or not word["reason"].strip():
            raise MarkError(
                f"{doc}:{j + 1}: docs-test mark {mark['body']!r}: expected 'skip (REASON)' "
                "or 'slow (REASON)'"
            )
        marks[word["word"]] = word["reason"].strip()
        j -= 1
    return marks
