"""A torchtitan git checkout's commits, as version sets and bisections name them (``git`` itself, no library)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

GITHUB = re.compile(r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


class GitError(ValueError):
    """A ref that names no commit of the checkout, or no checkout; the message says which."""


def git(repo, *args) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise GitError(f"git {' '.join(args)} in {repo}: {lines[-1] if lines else 'failed'}")
    return proc.stdout.strip()


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
