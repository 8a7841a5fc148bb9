"""Version sets: the packages a cell runs on, as a cell's ``versions`` axis (``torch==2.15.0``, or
``installed``: the environment pytest runs in). A set names exact versions (``==``) of torch and torchtitan, or
a torchtitan commit of a git checkout (``torchtitan@<sha>``); the rest of a set's environment follows the target
(its torchtitan generation, triton)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..words import release

INSTALLED = "installed"  # the environment pytest runs in: no other is built
PACKAGES = ("torch", "torchtitan")
PIN = re.compile(
    r"^\s*(?P<name>[A-Za-z][\w.-]*)\s*(?:==\s*(?P<version>[^,\s@]+)|@\s*(?P<commit>[0-9a-fA-F]{7,40}))\s*$"
)


class VersionError(ValueError):
    """A version set that cannot be used; the message names it."""


@dataclass(frozen=True)
class VersionSet:
    pins: tuple = ()  # ((package, version), ...) sorted; a torchtitan commit as ("torchtitan", "@<sha>")

    @property
    def installed(self) -> bool:
        return not self.pins

    def label(self) -> str:
        """How the set is written: ``torch==2.15.0,torchtitan@1a2b3c4``, or ``installed``."""
        return ",".join(f"{p}{v}" if v.startswith("@") else f"{p}=={v}" for p, v in self.pins) or INSTALLED

    def slug(self) -> str:
        """The set in a cell id and a folder name: ``torch-2.15.0``."""
        return "_".join(f"{p}-{v.lstrip('@')}" for p, v in self.pins) or INSTALLED

    def get(self, package):
        return dict(self.pins).get(package)

    def versions(self, installed: dict) -> dict:
        """The versions the set runs, over ``installed`` (the environment pytest runs in) where it names none."""
        return {**installed, **{p: v.lstrip("@") for p, v in self.pins}}

    def with_pin(self, package, version) -> "VersionSet":
        pins = {**dict(self.pins), package: version}
        return VersionSet(tuple(sorted(pins.items())))


def cell_set(axes: dict) -> VersionSet:
    """The version set a cell runs on (its ``versions`` axis; none: the installed versions)."""
    return parse(axes.get("versions", INSTALLED))


def parse(text: str) -> VersionSet:
    """``torch==2.15.0``, ``torch==2.15.0,torchtitan==0.3.0``, ``torchtitan@<sha>`` or ``installed``."""
    text = str(text).strip()
    if text in ("", INSTALLED):
        return VersionSet()
    pins = {}
    for part in text.split(","):
        m = PIN.match(part)
        if not m:
            raise VersionError(f"{part.strip()!r} is not a version pin: write torch==2.15.0 (or torchtitan@<commit>)")
        name = m["name"].lower()
        if name not in PACKAGES:
            raise VersionError(f"{name!r}: a version set pins {' and '.join(PACKAGES)} (the rest follows the target)")
        if m["version"]:
            try:
                Version(m["version"])
            except InvalidVersion:
                raise VersionError(f"{part.strip()!r}: {m['version']!r} is not a version") from None
        if name in pins:
            raise VersionError(f"{text!r} pins {name} twice")
        pins[name] = m["version"] or f"@{m['commit']}"
    return VersionSet(tuple(sorted(pins.items())))


def index_versions(package, index="https://pypi.org/simple", timeout=30.0, prereleases=False) -> list[str]:
    """The versions of ``package`` the index serves (PEP 691/700 JSON), oldest first; pre-releases and dev builds
    (nightlies) only with ``prereleases``. OSError where the index cannot be reached."""
    import urllib.request  # (here: every pytest run imports this module with the plugin's options)

    request = urllib.request.Request(
        f"{index.rstrip('/')}/{package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        doc = json.loads(answer.read())
    found = []
    for v in doc.get("versions", []):
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if prereleases or not (parsed.is_prerelease or parsed.is_devrelease):
            found.append(parsed)
    return [str(v) for v in sorted(found)]


def available_versions(package) -> list[str]:
    """The versions of ``package`` where the environments' installer (uv) takes them from: the folders of
    ``UV_FIND_LINKS``, and unless ``UV_NO_INDEX`` the index (``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``, else PyPI)."""
    found = set()
    for folder in filter(None, os.environ.get("UV_FIND_LINKS", "").replace(",", " ").split()):
        if Path(folder).is_dir():
            found |= set(wheel_versions(Path(folder), package))
    if os.environ.get("UV_NO_INDEX", "").lower() in ("", "0", "false"):
        index = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL") or "https://pypi.org/simple"
        found |= set(index_versions(package, index))
    return sorted(found, key=order)


def wheel_versions(folder: Path, package) -> list[str]:
    """The versions of ``package``'s wheels in a folder (nightlies included)."""
    return sorted({w.name.split("-")[1] for w in Path(folder).glob(f"{package}-*.whl")}, key=order)


def order(v):
    """A version's place in a list: releases by their order, anything else (a commit) after them."""
    try:
        return (0, Version(release(v)))
    except InvalidVersion:
        return (1, v)
