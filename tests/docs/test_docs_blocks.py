"""Every command, Python, SQL and TOML block of README.md and docs/*.md runs, as written.

One test per block, named `DOC:LINE`. Blocks of one doc share a working directory and run
in document order; a block selected alone (`-k`) first runs the blocks above it, slow ones
excepted (a default block must not need what a slow one wrote). A block marked
`<!-- docs-test: skip (REASON) -->` is reported as skipped with that reason; one marked
`slow (REASON)` carries the `docs_slow` marker and runs in its own CI step.
tests/docs/docs_runner.py says how blocks run and what is filled in; bounded_cli.py how
long-running commands (demo, collect, view --otlp) are bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_runner import DocSession, Fixtures, run_block
from mdblocks import ROOT, RUNNABLE, Block, all_blocks, doc_files

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.lang in RUNNABLE]
# Commands and Python share a doc's working directory; SQL and TOML read only the fixtures.
STATEFUL = ("sh", "python")


PARAMS = [
    pytest.param(b, id=f"{b.where}-{b.kind}", marks=[pytest.mark.docs_slow] if b.slow else [])
    for b in RUN
]


@pytest.mark.parametrize("block", PARAMS)
def test_block_runs(
    block: Block, docs_fixtures: Fixtures, doc_sessions: dict[str, DocSession]
) -> None:
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    session = doc_sessions[block.doc]
    for earlier in RUN if block.kind in STATEFUL else ():
        if earlier.doc != block.doc or earlier.line >= block.line or earlier.skip:
            continue
        if earlier.kind not in STATEFUL or (earlier.slow and not block.slow):
            continue  # a slow block is never a default block's prerequisite
        if earlier.line not in session.results:
            session.results[earlier.line] = run_block(earlier, session, docs_fixtures)
        if session.results[earlier.line] is not None:
            pytest.fail(f"{block.where}: an earlier block failed, {earlier.where}", pytrace=False)
    if block.line not in session.results:
        session.results[block.line] = run_block(block, session, docs_fixtures)
    failure = session.results[block.line]
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def test_every_fence_names_its_language() -> None:
    """An untagged fence could be a command nobody runs: tag it (`text` for output)."""
    unknown = [f"{b.where} ({b.lang or 'no language'})" for b in BLOCKS if b.kind == "unknown"]
    assert not unknown, (
        "fences the docs runner cannot classify; use ```sh / ```python / ```sql / ```toml "
        "for code, ```text for output, diagrams and option syntax: " + ", ".join(unknown)
    )


def test_docs_are_found() -> None:
    docs = {p.relative_to(ROOT).as_posix() for p in doc_files()}
    assert {"README.md", "docs/sql.md", "docs/viewer.md"} <= docs
    assert len(RUN) >= 30, "the runner lost most blocks"


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command is skipped here (it is the whole suite); CI runs it."""
    (block,) = [b for b in RUN if b.doc == "README.md" and "pytest" in b.text]
    assert block.skip, "the README's test command would run the suite inside itself"
    ci = (Path(ROOT) / ".ci" / "run").read_text()
    assert block.text.strip() in ci, "the README's test command and .ci/run differ"
