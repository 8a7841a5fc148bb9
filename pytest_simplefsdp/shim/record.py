"""A rank's probe records, under $SIMPLEFSDP_EVIDENCE_DIR (read per call: a fork server's ranks get theirs after
the fork): ``rank<R>.json`` (what was asked: config, degrees, meshes; what the run did: effects; the probe itself,
a mutant's count) and JSON lines per kind (``grads.rank<R>.jsonl``: per-parameter norms; ``steps.rank<R>.jsonl``: each
optimizer step's invariants). pytest_simplefsdp.judge reads them."""

import json
import os


def _folder():
    return os.environ.get("SIMPLEFSDP_EVIDENCE_DIR")


def _rank():
    return os.environ.get("RANK", "0")


def read(section, key, default):
    try:
        with open(os.path.join(_folder() or "", f"rank{_rank()}.json")) as f:
            return json.load(f).get(section, {}).get(key, default)
    except (OSError, ValueError):
        return default


def write(section, values):
    """Merge ``values`` into this rank's record's ``section``."""
    folder = _folder()
    if not folder:
        return
    path = os.path.join(folder, f"rank{_rank()}.json")
    os.makedirs(folder, exist_ok=True)
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {}
    record.setdefault(section, {}).update(values)
    with open(path, "w") as f:
        json.dump(record, f, default=str)


def append(stream, record):
    """One line of ``<stream>.rank<R>.jsonl``."""
    folder = _folder()
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{stream}.rank{_rank()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
