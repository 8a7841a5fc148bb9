"""Memory per rank in what a run reports: the JSON's cell records, a column of the composability grid, a line of
the page's cell details, and ``report --format memory`` for one run and two (report/memory.py)."""

import json

from pytest_simplefsdp.report import memory, page, tool
from pytest_simplefsdp.report.tables import grid

MIB = 2**20


def held(params, expected, model=4 * MIB, ranks=2):
    return {
        "model_bytes": model,
        "share": params / model,
        "expected_share": expected / model,
        "ratio": params / expected,
        "ranks": {
            str(r): {
                "params": params,
                "grads": params,
                "optimizer": 2 * params,
                "peak": None,
                "expected": expected,
                "allowance": 0,
                "adam": True,
            }
            for r in range(ranks)
        },
    }


def cell(cell_id, row, column, mem):
    return {
        "id": cell_id,
        "axes": {"model": "llama3"},
        "status": "passed",
        "row": row,
        "column": column,
        "wall": 3.0,
        "log_dir": "",
        "memory": mem,
    }


def doc(*cells):
    return {
        "runs": [
            {
                "meta": {
                    "matrix": "matrix/cpu.yaml",
                    "profile": "cpu",
                    "target": "titan03",
                    "device": "cpu",
                    "launcher": "fork",
                    "cells": len(cells),
                    "columns": ["eager", "aot_fx_trace"],
                },
                "cells": list(cells),
                "dropped": [],
                "baselines": [],
            }
        ]
    }


def test_the_grid_has_a_memory_column_per_layout():
    run = doc(
        cell("a", "llama3 dp2", "eager", held(2 * MIB, 2 * MIB)),
        cell("b", "llama3 dp2", "aot_fx_trace", held(2 * MIB, 2 * MIB)),
        cell("c", "llama3 dp4", "eager", held(MIB + MIB // 8, MIB)),
    )["runs"][0]
    headers, body = grid(run)
    assert headers[-1] == "memory: share/rank ×expected"
    assert {line[0]: line[-1] for line in body} == {"llama3 dp2": "0.500 ×1.000", "llama3 dp4": "0.281 ×1.125"}
    run["cells"] = [dict(c, memory=None) for c in run["cells"]]  # a target without the probe: no column
    assert "memory: share/rank ×expected" not in grid(run)[0]


def test_the_page_details_say_what_the_fullest_rank_held(tmp_path):
    rec = cell("a", "llama3 dp2", "eager", held(2 * MIB, 2 * MIB))
    assert memory.detail(rec) == (
        "memory per rank (fullest): params 2.00 MiB, grads 2.00 MiB, optimizer 4.00 MiB; "
        "0.500 of the model's 4.00 MiB of parameters, expected 0.500 (held / expected "
        "1.0000)"
    )
    assert "memory per rank (fullest): params 2.00 MiB" in page.render(doc(rec), tmp_path)


def test_report_format_memory_lists_ranks_and_compares_two_runs(tmp_path, capsys):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(doc(cell("llama3-dp2-eager", "llama3 dp2", "eager", held(3 * MIB, 2 * MIB)))))
    old.write_text(json.dumps(doc(cell("llama3-dp2-eager", "llama3 dp2", "eager", held(2 * MIB, 2 * MIB)))))
    assert tool.main([str(new), "--as-stored", "--format", "memory"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "cell",
        "rank",
        "params MiB",
        "grads MiB",
        "optimizer MiB",
        "expected MiB",
        "share",
        "held/expected",
    ]
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == [
        "llama3-dp2-eager",
        "0",
        "3.00",
        "3.00",
        "6.00",
        "2.00",
        "0.750",
        "1.5000",
    ]
    assert tool.main([str(new), "--as-stored", "--format", "memory", "--compare", str(old)]) == 0
    row = [c.strip() for c in capsys.readouterr().out.splitlines()[3].split("|")[1:-1]]
    assert row[-2:] == ["2.00", "1.5000"] and row[1] == "1"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(doc(cell("x", "llama3 dp2", "eager", None))))
    assert tool.main([str(empty), "--as-stored", "--format", "memory"]) == 0
    assert capsys.readouterr().out.startswith("no cell of this run recorded its memory")
