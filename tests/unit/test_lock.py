"""The development set is locked: what a fresh clone installs is requirements-dev.lock.

A requirement added to pyproject.toml without `make upgrade` would float (the lock is a
constraints file: a package it does not name takes the newest release), so every
package the dev extras reach must be pinned there, at a version its range admits.
"""

from __future__ import annotations

import tomllib

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import repo_root

ROOT = repo_root()


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements-dev.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate():
                (spec,) = requirement.specifier
                pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def _dev_requirements() -> list[Requirement]:
    """The project's own requirements and those of every extra `dev` reaches."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted, seen, found = ["dev"], set(), [Requirement(r) for r in project["dependencies"]]
    while wanted:
        extra = wanted.pop()
        seen.add(extra)
        for line in extras[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
                wanted += [e for e in requirement.extras if e not in seen]
            else:
                found.append(requirement)
    return found


def test_every_dev_requirement_is_pinned_in_the_lock_within_its_range() -> None:
    pins = _pins()
    environment = default_environment()
    for requirement in _dev_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in requirements-dev.lock: run `make upgrade`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} in the lock is outside {requirement.specifier}"
        )


def test_every_install_reads_the_lock() -> None:
    assert "requirements-dev.lock" in (ROOT / "tools/install-venv").read_text()
    assert "requirements-dev.lock" in (ROOT / "Dockerfile").read_text()
    assert "requirements-dev.lock" in (ROOT / "Makefile").read_text()
