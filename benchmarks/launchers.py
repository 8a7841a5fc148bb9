"""Benchmark: the same real CPU cells via (a) bare torchrun, (b) the plugin's torchrun launcher,
(c) the plugin's fork launcher. Prints per-cell medians, totals and ratios. Not a test.

    python benchmarks/launchers.py [--repeat 3] [--cells ID ID ...]

Goals (issue 6): harness overhead b/a within 2 %; fork at least 3x faster than a on eager cells;
losses identical between launchers. The machine's load average is printed with the results.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_simplefsdp.cells import expand  # noqa: E402
from pytest_simplefsdp.launch import LaunchSpec, TorchrunLauncher, free_port  # noqa: E402
from pytest_simplefsdp.matrix import load_matrix  # noqa: E402
from pytest_simplefsdp.results import parse_losses, read_text  # noqa: E402
from pytest_simplefsdp.targets import make_target  # noqa: E402

DEFAULT_CELLS = ["llama3-dp2-eager", "llama3-tp2-eager", "deepseek_v3-dp2-ep2-eager",
                 "llama3-dp2-aot_fx_trace-mp_default"]


def plain_matrix(tmp):
    """The CPU profile without numerics (no seed checkpoints or baselines: one run per cell)."""
    yaml = YAML(typ="rt")
    doc = yaml.load((ROOT / "matrix" / "cpu.yaml").read_text())
    for key in ("numerics", "groups"):
        doc.pop(key, None)
    path = Path(tmp) / "cpu.yaml"
    with open(path, "w") as f:
        yaml.dump(doc, f)
    return path


def bare(matrix_path, ids, work):
    """(a): the torchrun command a user would type, per cell, timed from outside."""
    matrix = load_matrix(matrix_path)
    target = make_target(matrix, ROOT / ".simplefsdp")
    target.prepare()
    cells = {c.id: c for c in expand(matrix)[0]}
    walls, losses = {}, {}
    for cid in ids:
        cell, out = cells[cid], Path(work) / "bare" / cid
        out.mkdir(parents=True, exist_ok=True)
        spec = LaunchSpec(cid, target.command(cell, dump_folder=out / "dump"), cell.world, out, 900, free_port())
        argv = TorchrunLauncher().torchrun_argv(spec)
        argv = [a for a in argv if not a.startswith(("--log-dir", "--redirects"))]
        env = dict(os.environ, **spec.command.env)
        env["PYTHONPATH"] = spec.command.env["PYTHONPATH"]
        start = time.monotonic()
        with open(out / "out.log", "wb") as f:
            subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
        walls[cid] = time.monotonic() - start
        losses[cid] = parse_losses(read_text([out / "out.log"]))
    return walls, losses


def plugin(matrix_path, ids, work, launcher):
    """(b)/(c): pytest --simplefsdp-matrix on the same cells; per-cell walls from its JSON."""
    js = Path(work) / f"{launcher}.json"
    expr = f"({' or '.join(ids)}) and not fsdp2"  # an id is a substring of its FSDP2 twin's
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "--simplefsdp-matrix", f"--simplefsdp-matrix-file={matrix_path}",
                    f"--simplefsdp-launcher={launcher}", f"--simplefsdp-json={js}", "-k", expr, "-q",
                    f"--simplefsdp-artifacts={Path(work) / launcher}", "-p", "no:cacheprovider"],
                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    total = time.monotonic() - start
    cells = {c["id"]: c for c in json.loads(js.read_text())["runs"][0]["cells"]}
    return total, {cid: cells[cid]["wall"] for cid in ids}, {cid: {int(k): v for k, v in cells[cid]["losses"].items()}
                                                               for cid in ids}, cells


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cells", nargs="+", default=DEFAULT_CELLS)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}; cores: {os.cpu_count()}")
    rows = {k: {cid: [] for cid in args.cells} for k in ("a", "b", "c")}
    totals = {k: [] for k in ("a", "b", "c")}
    same_losses = True
    with tempfile.TemporaryDirectory() as tmp:
        matrix = plain_matrix(tmp)
        for i in range(args.repeat):
            work = Path(tmp) / f"r{i}"
            walls, bare_losses = bare(matrix, args.cells, work)
            total_b, walls_b, losses_b, cells_b = plugin(matrix, args.cells, work, "torchrun")
            total_c, walls_c, losses_c, cells_c = plugin(matrix, args.cells, work, "fork")
            for cid in args.cells:
                rows["a"][cid].append(walls[cid])
                rows["b"][cid].append(walls_b[cid])
                rows["c"][cid].append(walls_c[cid])
                same_losses &= bare_losses[cid] == losses_b[cid] == losses_c[cid] != {}
                if cells_b[cid]["status"] != "passed" or cells_c[cid]["status"] != "passed":
                    print(f"  run {i}: {cid}: torchrun {cells_b[cid]['status']}, fork {cells_c[cid]['status']}")
            totals["a"].append(sum(walls.values()))
            totals["b"].append(total_b)
            totals["c"].append(total_c)
            print(f"run {i + 1}/{args.repeat}: a {totals['a'][-1]:.1f} s, b {total_b:.1f} s, c {total_c:.1f} s")
    med = {k: {cid: statistics.median(v) for cid, v in rows[k].items()} for k in rows}
    print(f"\nmedians over {args.repeat} runs (seconds; a = bare torchrun, b = plugin+torchrun, c = plugin+fork)")
    print(f"{'cell':45} {'a':>7} {'b':>7} {'c':>7} {'b/a':>6} {'a/c':>6}")
    for cid in args.cells:
        a, b, c = med["a"][cid], med["b"][cid], med["c"][cid]
        print(f"{cid:45} {a:7.1f} {b:7.1f} {c:7.1f} {b / a:6.3f} {a / c:6.2f}")
    ta, tb, tc = (statistics.median(totals[k]) for k in ("a", "b", "c"))
    print(f"{'total (b, c: whole pytest run)':45} {ta:7.1f} {tb:7.1f} {tc:7.1f} {tb / ta:6.3f} {ta / tc:6.2f}")
    print(f"losses identical between launchers: {same_losses}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
