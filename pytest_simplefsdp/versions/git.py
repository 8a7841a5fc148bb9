"""A torchtitan git checkout's commits, as version sets and bisections name them (``git`` itself, no library)."""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

GITHUB = re.compile(
    r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)([\w.-]+)/([\w.-]+?)(?:\.git)?/?$"
)


class GitError(ValueError):
    """A ref that names no commit of the checkout, or no checkout; the message says which."""


def git(repo, *args, raw=False) -> str:
    """git's output, stripped (``raw``: as it came, e.g. a file's text, whose line numbers count)."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise GitError(f"git {' '.join(args)} in {repo}: {lines[-1] if lines else 'failed'}")
    return proc.stdout if raw else proc.stdout.strip()


def short_sha(repo, ref) -> str:
    """A commit as the list of commits names it (12 hex digits), however the user wrote it."""
    return git(repo, "rev-parse", "--verify", "--short=12", f"{ref}^{{commit}}")


def is_checkout(folder) -> bool:
    return folder is not None and (Path(folder) / "torchtitan").is_dir() and (Path(folder) / ".git").exists()


def merge_base(repo, trunks=("main", "origin/main", "upstream/main")) -> tuple[str, str]:
    """(the ref, its commit): the merge base of HEAD with the first trunk branch the checkout has."""
    for trunk in trunks:
        try:
            short_sha(repo, trunk)
        except GitError:
            continue
        return f"merge-base(HEAD, {trunk})", git(repo, "merge-base", "HEAD", trunk)[:12]
    raise GitError(f"{repo} has none of the branches {', '.join(trunks)}: name the base (--simplefsdp-base=REF)")


def compare_url(repo, old, new) -> str | None:
    """GitHub's compare page for two commits of a checkout whose ``origin`` is on GitHub, else None."""
    try:
        found = GITHUB.match(git(repo, "remote", "get-url", "origin"))
    except GitError:
        return None
    return f"https://github.com/{found[1]}/{found[2]}/compare/{old}...{new}" if found else None


# a torchtitan commit range, as a known failure scopes itself: clauses ">=X" (X is in the commit's history: the commit
# or one before it), "<X" (X is not), ">X", "<=X", "==X", "!=X", joined by commas (">=A,<B")
COMMIT_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([0-9a-fA-F]{7,40})\s*$")


def commit_clauses(spec: str) -> list[tuple[str, str]]:
    """``">=5dd944e62,<1a2b3c4"`` -> [(">=", "5dd944e62"), ("<", "1a2b3c4")]; a ValueError names a clause that is
    not one."""
    out = []
    for part in str(spec).split(","):
        m = COMMIT_CLAUSE.match(part)
        if not m:
            raise ValueError(f"{part.strip()!r} is not a commit clause (>=, >, <=, <, ==, != and 7-40 hex digits)")
        out.append((m[1], m[2].lower()))
    return out


@functools.lru_cache(maxsize=None)
def find_commit(repo, name) -> str:
    """The full hash of the checkout's commit ``name`` names: its own hash (or any ref), else, in a mirror that rewrote
    the history (a bundle of upstream's commits), the commit whose ``upstream-commit:`` trailer names it."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
    except GitError:
        pass
    if re.fullmatch(r"[0-9a-fA-F]{7,40}", name):
        found = git(repo, "log", "--all", "--format=%H", f"--grep=^upstream-commit: {name.lower()}")
        if found:
            return found.splitlines()[0]
    raise GitError(f"{name} names no commit of {repo} (nor an upstream-commit: trailer there)")


@functools.lru_cache(maxsize=None)
def is_ancestor(repo, older, newer) -> bool:
    """Whether ``older`` is ``newer`` or in its history."""
    return (
        subprocess.run(
            ["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer], capture_output=True
        ).returncode
        == 0
    )


@dataclass(frozen=True)
class Commit:
    """The torchtitan commit a cell runs, with the checkout whose history orders it against the commits a known
    failure names (None: installed from a commit with no checkout here)."""

    sha: str
    repo: str | None

    def holds(self, spec: str) -> bool:
        """Whether the commit lies in the range; a GitError where it cannot be decided (no checkout, a commit the
        checkout lacks)."""
        if self.repo is None:
            raise GitError(
                f"torchtitan runs commit {self.sha[:12]}, but no checkout here holds its history "
                f"(--simplefsdp-torchtitan-repo=PATH)"
            )
        sha = find_commit(self.repo, self.sha)
        for op, name in commit_clauses(spec):
            other = find_commit(self.repo, name)
            after, before = is_ancestor(self.repo, other, sha), is_ancestor(self.repo, sha, other)
            if not {
                ">=": after,
                ">": after and not before,
                "<=": before,
                "<": not after,
                "==": after and before,
                "!=": not (after and before),
            }[op]:
                return False
        return True

    def about(self) -> dict:
        return {"sha": self.sha, "repo": self.repo}
