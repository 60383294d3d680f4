"""The README is a front door that stays true: short, its snippet the tested example's,
its links to files that exist; and no file cites a document the repository lacks."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import repo_root

README = repo_root() / "README.md"


def test_the_readme_stays_a_front_door() -> None:
    assert len(README.read_text().splitlines()) <= 400


def test_the_readme_snippets_are_the_tested_example() -> None:
    """Each Python block of the README is a verbatim excerpt of examples/first_webhook.py,
    which tests/integration/test_examples.py runs."""
    example = (repo_root() / "examples" / "first_webhook.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    for block in blocks:
        assert block in example or _dedented_in(block, example), block


def _dedented_in(block: str, text: str) -> bool:
    indented = "".join(f"    {line}" if line.strip() else line for line in block.splitlines(True))
    return indented in text


def test_the_readme_links_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text()):
        assert (repo_root() / target).exists(), target


def test_nothing_cites_a_spec_the_repository_does_not_carry() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.toml", "*.yml", "*.yaml", "Makefile"],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    cite = "SPEC" + " §"  # spelled apart: this file is tracked too
    citing = [
        name
        for name in tracked
        if name != "CHANGELOG.md" and cite in (repo_root() / name).read_text()
    ]
    assert citing == []


def test_the_tests_the_guarantees_page_names_exist() -> None:
    """docs/explanation/guarantees.md proves each guarantee by naming tests: a renamed or
    removed test must not leave the page pointing at nothing."""
    page = (repo_root() / "docs" / "explanation" / "guarantees.md").read_text()
    bullets = re.split(r"\n(?=- )", page)
    checked = 0
    for bullet in bullets:
        found = re.match(r"- `(tests/[\w/]+\.py)`", bullet)
        if not found:
            continue
        source = (repo_root() / found.group(1)).read_text()
        for name in re.findall(r"`(test_\w+)`", bullet):
            assert re.search(rf"def {name}\b", source), (found.group(1), name)
            checked += 1
    assert checked > 30
