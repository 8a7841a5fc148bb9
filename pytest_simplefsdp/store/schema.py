"""The stored run's format, as typed records (pydantic): what ``results.jsonl`` lines and the
``--simplefsdp-json`` document hold, and what the report tool, the compare step and stored baselines
read back. Input that does not fit is refused with the file, the record and the field named."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..kinds import Device, FailureClass, GateClass, Mutation, RecordType, Status, Tier


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer writers may add fields; readers keep them


class CellRecord(Record):
    """One cell's (or baseline's, or mutated run's) judged result: results.CellResult.record() plus its place in
    the table."""

    id: str
    axes: dict[str, Any]
    status: Status
    failure_class: FailureClass | None = None
    row: str
    column: str
    losses: dict[str, float | None] = {}
    error_line: str | None = None
    wall: float = 0.0
    log_dir: str = ""
    mutation: Mutation | None = None
    gate: GateClass | None = None  # under --simplefsdp-base: new, broken trunk, flaky or known
    memory: dict[str, Any] | None = None  # judge.layout.Memory: bytes per rank after step 1 (older runs: none)
    history: dict[str, Any] | None = None  # a new failure's cell history (judge.history.record; older runs: none)


class DroppedRecord(Record):
    id: str
    axes: dict[str, Any]
    rule: str
    reason: str
    row: str
    column: str


class Place(Record):
    """Where a valid cell of the matrix sits in the table (its model's grid, row and column), its id and axes."""

    model: str = ""
    row: str
    column: str
    id: str | None = None  # (runs before 0.2: none)
    axes: dict[str, Any] | None = None


class RunMeta(Record):
    matrix: str
    profile: str
    target: str
    device: Device
    launcher: str
    versions: dict[str, str] = {}
    date: str = ""
    cells: int
    dropped_cells: int = 0
    tier: Tier = Tier.REAL
    columns: list[str] = []
    valid: list[Place] = []  # every valid cell's place, selected or not (older runs: none)
    # under --simplefsdp-base: the base {ref, commit, repo} failures were rerun on, and the entry ids of its
    # known-failures file where that file is part of the checkout
    base: dict[str, str | list[str]] | None = None
    known_failures: dict[str, str] | None = None  # {path, sha256} of the file that judged the run (older: none)


class RunRecord(Record):
    meta: RunMeta
    cells: list[CellRecord] = []
    dropped: list[DroppedRecord] = []
    baselines: list[CellRecord] = []
    mutants: list[CellRecord] | None = None


class RunDoc(Record):
    runs: list[RunRecord]
    comparison: dict[str, str] | None = None  # key -> report.compare's change word
    compared_with: str | None = None  # the stored run compared with
    incidents: list[str] | None = None  # what went wrong in the launchers during the run (a fork server that ended)


LINE_KINDS = {
    RecordType.META: RunMeta,
    RecordType.CELL: CellRecord,
    RecordType.BASELINE: CellRecord,
    RecordType.DROPPED: DroppedRecord,
}


def problem(e: ValidationError) -> str:
    """The first problem of a validation error: the field's path and what is wrong with it."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(the record)"
    got = f" (got {err['input']!r})" if not isinstance(err.get("input"), (dict, list)) else ""
    return f"{where}: {err['msg']}{got}"


def to_plain(model: BaseModel) -> dict:
    """Back to the plain JSON the renderers take (enums as their words, absent optional parts left out)."""
    return model.model_dump(mode="json", exclude_none=False)
