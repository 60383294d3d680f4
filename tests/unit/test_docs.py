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


# What a path in the text may name that is not in the repository: what runs make
# (loadtest/out), what a wheel holds (poller/_migrations).
MADE = ("loadtest/out", "poller/_migrations")
_PATH = re.compile(r"(?<![\w/.@-])((?:poller|tests|loadtest|docs|db|tools|examples)/[\w./-]*\w)")


def test_every_path_the_code_and_docs_cite_exists() -> None:
    """A docstring or a page that names a file (a test, a module, an example) names one
    the repository has: a renamed file is renamed where it is cited, too. (The changelog
    tells of files as they were.)"""
    root = repo_root()
    cited = [*root.glob("poller/**/*.py"), *root.glob("docs/**/*.md"), *root.glob("tests/**/*.py"),
             *root.glob("loadtest/*.py"), root / "README.md", root / "Makefile"]  # fmt: skip
    missing = sorted(
        f"{path.relative_to(root)}: {ref}"
        for path in cited
        for ref in (m.group(1).rstrip(".") for m in _PATH.finditer(path.read_text()))
        if not ref.startswith(MADE)
        and not (root / ref).exists()
        and not (root / f"{ref}.py").exists()  # a module as `flask --app` names it
    )
    assert missing == []


def test_the_site_shows_no_raw_role_and_no_unset_default() -> None:
    """docs/hooks/reference.py cleans what mkdocstrings and mkdocs-click leave raw."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hook", repo_root() / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    html = (
        "<p>:func:<code>~poller.enqueue</code> and :class:<code>poller.Message</code></p>"
        "<td><code>Sentinel.UNSET</code></td>"
    )
    assert hook.on_page_content(html) == (
        "<p><code>enqueue</code> and <code>poller.Message</code></p><td></td>"
    )


def test_the_reference_sections_in_the_pages_are_the_codes() -> None:
    """The settings, errors, SQLSTATEs, API routes and module map are written into the
    pages (readable in the repository): as the code makes them now (`make reference`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hook", repo_root() / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    stale = [
        str(page.relative_to(repo_root()))
        for page in sorted((repo_root() / "docs").rglob("*.md"))
        if hook.regenerate(page.read_text()) != page.read_text()
    ]
    assert stale == [], "run `make reference`"
