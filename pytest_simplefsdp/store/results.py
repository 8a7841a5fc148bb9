"""The result store: each record of the run, once it arrives with its test report, appended to
``results.jsonl`` (flushed and synced, so an interrupted or killed run keeps what finished) and kept
for the table, JSON and status file. Records made in this process wait in ``pending`` until the test
report of their item carries them (pytest-xdist takes them from a worker to the controller that way)."""

from __future__ import annotations

import datetime
import json
import os
import sqlite3
import threading
import warnings
from pathlib import Path

from ..kinds import RecordType, Status
from .history import versions_of


class ResultStore:
    def __init__(self, run_dir: Path, runs, launcher_of, hook=None, config=None, about=None):
        self.run_dir, self.runs, self.launcher_of = run_dir, runs, launcher_of  # run -> its launcher's name
        self.about = dict(about or {})  # what every meta record adds (the known-failures file that judged the run)
        self.hook, self.config = hook, config
        self.lock = threading.RLock()  # cells may run in threads (--simplefsdp-jobs)
        self.pending: list = []  # records made since the last test report (they ride on the next one)
        self.records: list = []  # every record of the run, from the test reports: what the table and JSON show
        self.jsonl = None
        self.selections: dict = {}  # run name -> its --simplefsdp-changed selection (the session's, filled at collection)
        self.history = None  # store.history.History the controller appends each judged cell to (None: off)

    @property
    def path(self):
        return self.run_dir / "results.jsonl"

    def record(self, run, result, kind=RecordType.CELL):
        """A judged result of this process: its result.json now, its record on the next test report (plain data:
        the type as its word, which pytest-xdist's channel carries)."""
        rec = run.record_of(result)
        rec.update(type=str(RecordType(kind)), matrix=run.name)
        # a kept job's folder is shared by later runs: this run writes nothing there; a cell that never launched
        # (skipped, no environment, no seed) has no folder, and its record is in results.jsonl alone
        if result.log_dir and not result.reused_from:
            Path(result.log_dir).mkdir(parents=True, exist_ok=True)
            (Path(result.log_dir) / "result.json").write_text(json.dumps(rec, indent=1) + "\n")
        with self.lock:
            self.pending.append(rec)
        return rec

    def take_pending(self):
        with self.lock:
            out, self.pending = self.pending, []
        return out

    def collect(self, rec):
        """A record as the controller receives it (from this process or a worker): stored and announced."""
        with self.lock:
            self.records.append(rec)
            self._open()
            self._write(rec)
            self._remember(rec)
        if self.hook is not None:
            self.hook.pytest_simplefsdp_cell_result(config=self.config, record=rec)

    def _open(self):
        if self.jsonl is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.jsonl = open(self.path, "a")
            for run in self.runs:
                self._write(self.meta(run))
                for rec in run.dropped_records():
                    self._write({"type": str(RecordType.DROPPED), "matrix": run.name, **rec})

    def _write(self, record):
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        os.fsync(self.jsonl.fileno())

    def _remember(self, rec):
        """The cell's row in the history store (its own runs only: not a mutant's, a baseline's or a skip)."""
        if (
            self.history is None
            or rec["type"] != RecordType.CELL
            or rec.get("mutant")
            or rec["status"] == Status.SKIPPED
        ):
            return
        run = next(r for r in self.runs if r.name == rec["matrix"])
        try:
            self.history.append(
                str(self.run_dir),
                datetime.datetime.now().isoformat(timespec="seconds"),
                run.matrix.profile,
                {**rec, "versions": versions_of(run, rec.get("versions") or {})},
            )
        except sqlite3.Error as e:  # the run's own records stand; only the history stops
            warnings.warn(
                f"simplefsdp: the history store {self.history.path} failed ({e}); cells from here on are "
                "not added to it",
                stacklevel=2,
            )
            self.history = None

    def meta(self, run):
        chosen = self.selections.get(run.name)  # --simplefsdp-changed: the cells the change reaches (set at collection)
        return {**run.meta(self.launcher_of(run)), **self.about, **({"changed": chosen} if chosen else {})}

    def document(self):
        """The run as --simplefsdp-json writes it: per matrix file its meta, cells (in matrix order),
        n/a cells, baselines and mutants."""
        runs = []
        for run in self.runs:
            order = {c.id: i for i, c in enumerate(run.cells)}
            mine = [r for r in self.records if r["matrix"] == run.name]
            strip = [{k: v for k, v in r.items() if k not in ("type", "matrix")} for r in mine]
            cells = sorted(
                (s for r, s in zip(mine, strip) if r["type"] == RecordType.CELL and not r.get("mutant")),
                key=lambda r: order.get(r["id"], len(order)),
            )
            baselines = [s for r, s in zip(mine, strip) if r["type"] == RecordType.BASELINE]
            mutated = [s for r, s in zip(mine, strip) if r["type"] == RecordType.CELL and r.get("mutant")]
            meta = self.meta(run)
            meta.pop("type")
            runs.append(
                {
                    "meta": meta,
                    "cells": cells,
                    "dropped": run.dropped_records(),
                    "baselines": baselines,
                    **({"mutants": mutated} if mutated else {}),
                }
            )
        return {"runs": runs}

    def close(self):
        if self.history is not None:
            self.history.close()
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
