"""Between results and verdict: evidence that a passing cell ran what its label says.

A cell that exits 0 and trains has not yet shown that its axes took effect: a flag the system under
test ignores would pass as well (``backend: inductor`` on torchtitan 0.3's aot_fx_trace once did
nothing). A target names, per cell, the checks its label implies; each reads what the run left behind
and says what it expected and what it saw. A contradicted label fails the cell as ``invalid_config``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..paths import probe_folder


@dataclass(frozen=True)
class Evidence:
    axis: str  # the axis (and value) the check is for, e.g. "backend=inductor"
    expected: str
    seen: str
    ok: bool
    infra: bool = False  # the probe that would have shown it did not run (the label is not contradicted)

    def line(self):
        return f"{self.axis}: expected {self.expected}, saw {self.seen}"

    def record(self):
        return asdict(self)


@dataclass(frozen=True)
class Expect:
    """One thing a cell's label implies about its run: ``key`` of every rank's probe record is ``value`` (``each``:
    the key maps each transformer block to a value, and every block's is ``value``; ``every`` N: only every N-th
    block's, in the model's order, the others' ``default``, as layer-selective activation checkpointing wraps them)."""

    axis: str  # the label part, e.g. "tp=2"
    key: str  # "<section>.<name>" of the probe record, e.g. "effects.tp", "effects.memory_policy"
    value: str
    default: str | None = None  # what an absent key means (no pipeline schedule ran, no graph was tagged)
    hooks: tuple = ()  # the probe's hooks that record the key (probe.hooks): one unattached, the key says nothing
    each: bool = False
    every: int = 0

    def line(self):
        blocks = f" of every {self.every}. block" if self.every else " of every block" if self.each else ""
        return f"{self.axis} <- {self.key}{blocks}"

    def want(self, position: int) -> str | None:
        """The value block ``position`` (0-based, in the model's order) must show."""
        return self.value if not self.every or (position + 1) % self.every == 0 else self.default


def read_probes(folder: Path) -> dict:
    """rank -> the probe record it wrote ($SIMPLEFSDP_EVIDENCE_DIR/rank<N>.json)."""
    records = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        try:
            records[int(path.stem[4:])] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return records


def _lookup(record, key, default):
    section, _, name = key.partition(".")
    value = record.get(section, {}).get(name, default)
    return None if value is None else str(value)


def check(expects: list, log_dir: Path, ranks=None) -> list:
    """The evidence for each expectation, from every rank's probe record in the cell's folder (``ranks``: the ranks
    that ran; default: those that left a record). A key whose probe hook did not run or attach on a rank says nothing
    about the label there: that is an infra failure of the probe, not a contradicted label."""
    if not expects:
        return []
    folder = probe_folder(log_dir)
    records = read_probes(folder)
    ranks = sorted(records) if ranks is None else list(ranks)
    out = []
    for e in expects:
        expected = f"{e.key} = {e.value} {'for every block ' if e.each else ''}on every rank"
        if not records:
            out.append(Evidence(e.axis, expected, f"no probe record in {folder}", False, infra=bool(e.hooks)))
            continue
        blind = _probe_missing(e, records, ranks)
        if blind:
            out.append(Evidence(e.axis, expected, blind, False, infra=True))
            continue
        if e.each:
            out.append(_each_block(e, records, ranks))
            continue
        seen = {rank: _lookup(records.get(rank, {}), e.key, e.default) for rank in ranks}
        wrong = {r: v for r, v in seen.items() if v != e.value}
        if not wrong:
            out.append(Evidence(e.axis, expected, f"{e.value} on ranks {', '.join(map(str, seen))}", True))
        else:
            by_value: dict = {}
            for r, v in wrong.items():
                by_value.setdefault(v, []).append(r)
            saw = "; ".join(
                f"{'nothing' if v is None else v} on ranks {', '.join(map(str, rs))}" for v, rs in by_value.items()
            )
            out.append(Evidence(e.axis, expected, saw, False))
    return out


def _each_block(e: Expect, records, ranks) -> Evidence:
    """Every block's value of ``e.key`` on every rank is ``e.value`` (a label applied to some blocks is not)."""
    section, _, name = e.key.partition(".")
    per = {r: records.get(r, {}).get(section, {}).get(name) or {} for r in ranks}
    which = f"every {e.every}. block ({e.default} on the others)" if e.every else "every block"
    expected = f"{e.key} = {e.value} for {which} on every rank"
    if not any(per.values()):
        return Evidence(e.axis, expected, f"no block in {e.key} on ranks {', '.join(map(str, ranks))}", False)
    wrong: dict = {}
    for r, blocks in per.items():
        ordered = sorted(blocks.items(), key=lambda kv: (len(kv[0]), kv[0])) if blocks else [("(none)", "nothing")]
        for position, (block, value) in enumerate(ordered):
            if value != e.want(position):
                wrong.setdefault(f"block {block}: {value}", []).append(r)
    if wrong:
        return Evidence(
            e.axis,
            expected,
            "; ".join(f"{k} on ranks {', '.join(map(str, rs))}" for k, rs in sorted(wrong.items())),
            False,
        )
    blocks = sorted({b for v in per.values() for b in v}, key=lambda b: (len(b), b))
    which = f"for every {e.every}. block and {e.default} for the others of blocks" if e.every else "for blocks"
    return Evidence(
        e.axis, expected, f"{e.value} {which} {', '.join(blocks)} on ranks {', '.join(map(str, ranks))}", True
    )


def _probe_missing(e: Expect, records, ranks) -> str | None:
    """Why the probe cannot speak for ``e`` on some ranks (it did not run there, or its hook did not attach)."""
    if not e.hooks:
        return None
    not_run = [r for r in ranks if "started" not in records.get(r, {}).get("probe", {})]
    if not_run:
        return f"nothing: the evidence probe did not run on ranks {', '.join(map(str, not_run))}"
    for hook in e.hooks:
        unhooked = [r for r in ranks if hook not in records[r]["probe"].get("hooks", [])]
        if unhooked:
            return (
                f"nothing: the evidence probe's {hook!r} hook did not attach on ranks "
                f"{', '.join(map(str, unhooked))} (torchtitan was imported past it)"
            )
    return None


def _trace_entries(trace_dir: Path, key: str):
    """Per rank-file counts of structured-trace records of kind ``key``. TORCH_TRACE writes a record as
    one line ``<glog prefix>] {"<kind>": {...}, ...}`` followed by tab-indented payload lines."""
    needle = f'] {{"{key}"'.encode()
    counts = {}
    for path in sorted(Path(trace_dir).glob("*.log")):
        n = 0
        with open(path, "rb") as f:
            for raw in f:
                if raw[:1] != b"\t" and needle in raw:
                    try:
                        n += key in json.loads(raw[raw.index(needle) + 2 :])
                    except ValueError:
                        continue
        counts[path.name] = n
    return counts


def inductor_codegen(trace_dir: Path, axis="backend=inductor") -> Evidence:
    """Inductor wrote output code (``inductor_output_code`` in the compile trace) on every traced rank."""
    expected = "inductor output code in the compile trace of every rank"
    if not Path(trace_dir).is_dir():
        return Evidence(axis, expected, f"no compile trace at {trace_dir}", False)
    counts = _trace_entries(trace_dir, "inductor_output_code")
    if not counts:
        return Evidence(axis, expected, f"no trace files in {trace_dir}", False)
    missing = [name for name, n in counts.items() if n == 0]
    total = sum(counts.values())
    if missing:
        return Evidence(
            axis,
            expected,
            f"none in {len(missing)} of {len(counts)} trace files ({', '.join(missing[:3])}); {total} elsewhere",
            False,
        )
    return Evidence(axis, expected, f"{total} inductor output-code records in {len(counts)} trace files", True)
