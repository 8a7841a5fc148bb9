"""History per cell: every judged cell of every run appended to one SQLite file (``.simplefsdp/history.sqlite``
under the rootdir, or --simplefsdp-history), so a cell's record outlives its run folder. A cell's rows are keyed
by its profile, its id and the versions it ran on; the newest come first. Only the session's controller writes
(one connection, a commit per cell: a killed run keeps what finished); workers read."""

from __future__ import annotations

import json
import sqlite3
import warnings
from contextlib import closing
from pathlib import Path

WINDOW = 10  # the runs a cell's pass rate and flakiness are read over

SCHEMA = """CREATE TABLE IF NOT EXISTS cells (
    run TEXT NOT NULL, at TEXT NOT NULL, profile TEXT NOT NULL, cell TEXT NOT NULL, versions TEXT NOT NULL,
    status TEXT NOT NULL, failure_class TEXT, signature TEXT, log_dir TEXT)"""


def versions_of(run, versions: dict) -> dict:
    """A cell's versions as its history keys them: what it ran on, and the torchtitan commit its run installed."""
    commit = run.commit_of()
    return {**versions, **({"torchtitan_commit": commit.sha} if commit else {})}


def versions_key(versions: dict) -> str:
    """The versions a row is kept under: the cell's packages and versions (a torchtitan commit included where the
    version set named one), as one canonical string."""
    return json.dumps({k: versions[k] for k in sorted(versions) if k != "python"}, separators=(",", ":"))


class History:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.db: sqlite3.Connection | None = None
        self.unreadable = False  # set on the first read that failed: judged without history from then on

    def _connect(self, write=False) -> sqlite3.Connection | None:
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.is_file():
            return None
        db = sqlite3.connect(self.path, timeout=30)
        db.execute(SCHEMA)
        return db

    def append(self, run: str, at: str, profile: str, rec: dict):
        """One judged cell record of a run (mutated runs and baselines are not the cell's history)."""
        if self.db is None:
            self.db = self._connect(write=True)
        assert self.db is not None  # (a writer's connection is always made)
        with self.db:
            self.db.execute(
                "INSERT INTO cells VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run,
                    at,
                    profile,
                    rec["id"],
                    versions_key(rec.get("versions") or {}),
                    str(rec["status"]),
                    rec.get("failure_class"),
                    rec.get("signature") or None,
                    rec.get("log_dir") or "",
                ),
            )

    def of(self, profile: str, cell: str, versions: dict, before_run: str | None = None, limit=WINDOW) -> list:
        """The cell's newest ``limit`` rows on these versions (those of ``before_run`` left out: the run asking),
        newest first, as {run, at, status, failure_class, signature}. A store that cannot be read (not SQLite,
        corrupt, locked past the timeout) warns once and reads as no history: a verdict never waits on it."""
        if self.unreadable:
            return []
        try:
            db = self._connect()
            if db is None:
                return []
            with closing(db):
                rows = db.execute(
                    "SELECT run, at, status, failure_class, signature FROM cells WHERE profile = ? AND "
                    "cell = ? AND versions = ? AND run != ? ORDER BY at DESC, rowid DESC LIMIT ?",
                    (profile, cell, versions_key(versions), before_run or "", limit),
                ).fetchall()
        except sqlite3.Error as e:
            self.unreadable = True
            warnings.warn(
                f"simplefsdp: the history store {self.path} could not be read ({e}); failures are judged "
                f"without their history",
                stacklevel=2,
            )
            return []
        return [dict(zip(("run", "at", "status", "failure_class", "signature"), r)) for r in rows]

    def streaks(self, limit=WINDOW) -> list:
        """Every cell's latest ``limit`` runs per profile and versions: [(profile, cell, versions, rows newest first)]."""
        db = self._connect()
        if db is None:
            return []
        with closing(db):
            rows = db.execute(
                "SELECT profile, cell, versions, run, at, status, failure_class, signature FROM cells "
                "ORDER BY profile, cell, versions, at DESC, rowid DESC"
            ).fetchall()
        out: dict = {}
        for profile, cell, versions, *rest in rows:
            kept = out.setdefault((profile, cell, versions), [])
            if len(kept) < limit:
                kept.append(dict(zip(("run", "at", "status", "failure_class", "signature"), rest)))
        return [(p, c, json.loads(v), r) for (p, c, v), r in out.items()]

    def close(self):
        if self.db is not None:
            self.db.close()
            self.db = None
