"""A stored run read back: a results.jsonl (JSON lines, flushed as cells finish, so a killed run keeps what it
finished) or a --simplefsdp-json document, every record checked against the stored format (schema.py)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

from ..kinds import RecordType
from . import schema

WALLTIME_PLOT = "walltime.png"  # the run folder's overview plot, written at its end


SECTIONS = {RecordType.CELL: "cells", RecordType.BASELINE: "baselines", RecordType.DROPPED: "dropped"}  # of a run


class RunError(ValueError):
    """A stored run that cannot be read: the message names the file, the record (its line) and the field."""


def load_run(path):
    """Read a run from a JSON document or JSON lines; returns {"runs": [{meta, cells, dropped, baselines}]}.
    Every record is checked against the stored format (schema.py): a bad one is a RunError naming the
    file, the record (its line in JSON lines) and the field."""
    with open(path) as f:
        text = f.read()
    if not text.strip():
        raise RunError(f"{path}: empty: no run recorded")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        doc = None
        try:
            json.loads(text.strip().splitlines()[0])  # JSON lines: each line a record of its own
        except json.JSONDecodeError:
            raise RunError(f"{path}:{e.lineno}: not valid JSON (cut short?): {e.msg}") from None
    if isinstance(doc, dict) and "type" not in doc:
        try:
            return {k: v for k, v in schema.to_plain(schema.RunDoc.model_validate(doc)).items() if v is not None}
        except schema.ValidationError as e:
            raise RunError(f"{path}: not a simplefsdp run: {schema.problem(e)}") from None
    return _load_lines(path, text)


def _load_lines(path, text):
    runs = OrderedDict()
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):
                break  # a line cut short by a killed run: keep the rest
            raise RunError(f"{path}:{n}: not a JSON record: {e.msg}") from None
        kind = rec.pop("type", RecordType.CELL) if isinstance(rec, dict) else None
        if kind not in schema.LINE_KINDS:
            raise RunError(
                f"{path}:{n}: not a simplefsdp record (type {kind!r}; known: {', '.join(schema.LINE_KINDS)})"
            )
        try:
            rec = schema.to_plain(schema.LINE_KINDS[kind].model_validate(rec))
        except schema.ValidationError as e:
            raise RunError(f"{path}:{n}: {kind} record: {schema.problem(e)}") from None
        run = runs.setdefault(rec.get("matrix"), {"meta": None, "cells": [], "dropped": [], "baselines": []})
        if kind == RecordType.META:
            run["meta"] = rec
        else:
            run[SECTIONS[RecordType(kind)]].append(rec)
    missing = [name for name, run in runs.items() if run["meta"] is None]
    if missing:
        raise RunError(f"{path}: records of {', '.join(map(str, missing))} come without its meta record")
    if not runs:
        raise RunError(f"{path}: no run recorded")
    doc = {"runs": list(runs.values())}
    plot = Path(path).resolve().parent / WALLTIME_PLOT  # the run folder's overview plot, written at its end
    if plot.exists():
        doc["walltime_plot"] = str(plot)
    return doc
