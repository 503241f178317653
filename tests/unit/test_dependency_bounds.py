"""pyproject.toml's lower bounds are the releases that .ci/lowest.txt pins, which the README's
lowest-versions check installs and tests."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    bounds = {}
    for requirement in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement.strip())
        if m:
            bounds[m[1].lower()] = m[2]
    return bounds


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_each_lower_bound_is_pinned_at_its_release_by_the_lowest_versions_check():
    bounds, pins = _lower_bounds(), _pins()
    assert len(bounds) >= 15  # every dependency but HEU (pinned exactly) has a lower bound
    assert set(pins) == set(bounds), sorted(set(pins) ^ set(bounds))
    for name, low in bounds.items():
        release = low.split(".")
        assert pins[name].split(".")[:len(release)] == release, f"{name}: >={low} in pyproject, {pins[name]} here"
