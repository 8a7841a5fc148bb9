"""What --simplefsdp-footprint costs a cell, and whether it changes what the cell computes: each cell run with and
without it, alternately, side by side in one run (fresh artifacts folders, the kept seeds and baselines reused),
from the rootdir this is started in. Prints per cell the wall of each run, the ratio and whether the losses and
every parameter's gradient norms are the same bits. It measures, it asserts nothing.

    python benchmarks/footprint.py matrix/cpu.yaml::llama3-dp2-eager ... [--repeat 2] [--python PYTHON]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(python, cell, footprint, folder) -> dict:
    args = [python, "-m", "pytest", "--simplefsdp-matrix", cell, f"--simplefsdp-artifacts={folder}", "-q"]
    subprocess.run(
        args + ["-p", "no:cacheprovider"] + (["--simplefsdp-footprint"] if footprint else []),
        capture_output=True,
        text=True,
    )
    records = [json.loads(line) for line in (Path(folder) / "results.jsonl").read_text().splitlines()]
    return next(r for r in records if r.get("type") == "cell")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cells", nargs="+")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args(argv)
    print("cell | plain s | footprint s | ratio | same bits | files | functions")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for cell in a.cells:
            walls, same, shape = {False: [], True: []}, True, ""
            for n in range(a.repeat):
                recs = {}
                for on in (n % 2 == 0, n % 2 != 0):  # alternate which goes first
                    recs[on] = run(a.python, cell, on, Path(tmp) / f"{len(walls[on])}-{on}-{cell.split('::')[-1]}")
                    walls[on].append(recs[on]["wall"])
                same &= all(recs[True].get(k) == recs[False].get(k) for k in ("status", "losses", "grad_norms"))
                folder = Path(recs[True]["log_dir"]) / "evidence"
                docs = [json.loads(f.read_text()) for f in folder.glob("footprint.rank*.json")]
                if docs:
                    shape = f"{len(docs[0]['files'])} | {sum(len(q) for q in docs[0]['functions'].values())}"
            plain, traced = statistics.median(walls[False]), statistics.median(walls[True])
            ratios.append(traced / plain)
            print(f"{cell} | {plain:.1f} | {traced:.1f} | {traced / plain:.2f} | {'yes' if same else 'NO'} | {shape}")
    print(f"median ratio {statistics.median(ratios):.2f} over {len(ratios)} cells ({a.repeat} runs each way)")


if __name__ == "__main__":
    main()
