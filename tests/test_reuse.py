"""Seed checkpoints and numerics baselines kept across runs by a content key (reuse.py); --simplefsdp-fresh.
(The seed side runs on real cells: tests/test_e2e_titan.py.)"""

import os
import platform
import subprocess
import sys

from helpers import NUMERICS, fake_matrix, run_doc


def test_a_baseline_job_is_kept_and_used_again_until_an_input_changes_or_the_run_is_fresh(run_matrix, pytester):
    data = pytester.path / "data.txt"  # a file the command names: its bytes enter the key
    data.write_text("v1")
    text = fake_matrix(modes=["pass", "perturb"], args=f', "--delta", "0.000001", "--flag", "{data}"', extra=NUMERICS)
    reuse = pytester.path / ".simplefsdp" / "reuse"

    def run(n, *args):
        out = pytester.path / f"run{n}.json"
        result = run_matrix(
            text, f"--simplefsdp-json={out}", f"--simplefsdp-artifacts={pytester.path / f'runs{n}'}", *args
        )
        return result, run_doc(out)

    result, doc = run(1, "-k", "perturb")  # pass-r2 is not selected: its baseline job runs on its own
    result.assert_outcomes(passed=1)
    assert [(b["id"], b["reused_from"]) for b in doc["baselines"]] == [("baseline-pass-r2", None)]
    kept = sorted(reuse.glob("baseline-pass-r2-*"))
    assert len(kept) == 1 and (kept[0] / "reuse.json").is_file() and (kept[0] / "evidence").is_dir()

    dry = run_matrix(text, "--simplefsdp-dry-run", "-k", "perturb")
    dry.stdout.fnmatch_lines(
        ["*::baseline-pass-r2 *baseline of 1 cell: perturb-r2  (kept from an earlier run: not run again)"]
    )

    # unfinished folders a killed session left (its pid is gone) are swept; a live process's folder stays
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = platform.node()
    dead, live, other = (
        reuse / f".seed-llama3~{h}~{pid}~0a1b2c3d"
        for h, pid in [(host, gone.stdout.strip()), (host, os.getpid()), ("elsewhere", gone.stdout.strip())]
    )
    for folder in (dead, live, other):
        folder.mkdir()
    result, doc = run(2, "-k", "perturb")
    result.assert_outcomes(passed=1)
    assert not dead.exists() and live.is_dir() and other.is_dir()
    base = doc["baselines"][0]
    assert base["reused_from"] == str(kept[0]) and base["losses"] == {"1": 10.0, "2": 5.0, "3": 3.33333}
    assert sorted(p.name for p in kept[0].iterdir()) == ["evidence", "reuse.json"]  # the run wrote nothing there
    assert "kept from an earlier run" in " ".join(base["details"])
    assert doc["cells"][0]["numerics"]["baseline"] == "baseline-pass-r2"
    assert not (pytester.path / "runs2" / "fake" / "baseline-pass-r2").exists()  # nothing of it ran
    # a run with a `versions` axis uses it too (kept by a run without the axis: it stands for this run's axes)
    result, doc = run("2v", "-k", "perturb", "--simplefsdp-versions=installed")
    result.assert_outcomes(passed=1)
    assert doc["baselines"][0]["reused_from"] == str(kept[0]) and doc["baselines"][0]["axes"]["versions"] == "installed"

    data.write_text("v2")  # an input changed: a new key, the job runs again and is kept beside the old one
    result, doc = run(3, "-k", "perturb")
    assert doc["baselines"][0]["reused_from"] is None and len(list(reuse.glob("baseline-pass-r2-*"))) == 2
    assert (pytester.path / "runs3" / "fake" / "baseline-pass-r2" / "rank0.log").is_file()

    result, doc = run(4, "-k", "perturb", "--simplefsdp-fresh")  # same key, but fresh: runs again, replaces it
    assert doc["baselines"][0]["reused_from"] is None and len(list(reuse.glob("baseline-pass-r2-*"))) == 2
    assert (pytester.path / "runs4" / "fake" / "baseline-pass-r2" / "rank0.log").is_file()

    result, doc = run(5)  # a cell of the matrix always runs, even where a kept baseline has its axes
    result.assert_outcomes(passed=2)
    cells = {c["id"]: c for c in doc["cells"]}
    assert (pytester.path / "runs5" / "fake" / "pass-r2" / "rank0.log").is_file()
    assert cells["pass-r2"]["details"] == [] and doc["baselines"] == []


def test_every_record_says_which_launcher_ran_it(run_matrix, pytester):
    out = pytester.path / "run.json"
    result = run_matrix(fake_matrix(modes=["pass"]), f"--simplefsdp-json={out}", launcher="auto")
    result.assert_outcomes(passed=1)
    # the header names the launcher that will run the cells, and why it is not the one asked for
    result.stdout.fnmatch_lines(
        [
            "simplefsdp: fake.yaml profile=fake * launcher=local (fork runs this target's program "
            "under local; auto's choice for cpu cells)",
            "*simplefsdp matrix fake.yaml (profile fake, target command, launcher local (asked: fork))*",
        ]
    )
    doc = run_doc(out)
    # a script is not `python -m module`: the fork launcher hands it to the local one, and the record says so
    assert doc["meta"]["launcher"] == "fork" and doc["cells"][0]["launcher"] == "local"


def test_a_reuse_dir_shared_by_two_rootdirs_serves_the_job_one_of_them_kept(run_matrix, pytester):
    """--simplefsdp-reuse-dir: a baseline kept by a run in one rootdir is used by a run in another (the job's key
    names neither rootdir: its .simplefsdp and the reuse folder are placeholders in it); the default stays per
    rootdir."""
    shared, other = pytester.mkdir("shared-reuse"), pytester.mkdir("other-checkout")
    text = fake_matrix(modes=["pass", "perturb"], args=', "--delta", "0.000001"', extra=NUMERICS)

    def run(n, *args):
        out = pytester.path / f"run{n}.json"
        result = run_matrix(text, f"--simplefsdp-json={out}", "-k", "perturb", *args)
        result.assert_outcomes(passed=1)
        return run_doc(out)["baselines"][0]

    first = run(1, f"--simplefsdp-reuse-dir={shared}")
    (kept,) = shared.glob("baseline-pass-r2-*")
    assert first["reused_from"] is None and not (pytester.path / ".simplefsdp" / "reuse").exists()
    elsewhere = run(2, f"--simplefsdp-reuse-dir={shared}", f"--rootdir={other}")
    assert elsewhere["reused_from"] == str(kept), elsewhere
    assert not (other / ".simplefsdp" / "reuse").exists()
    alone = run(3, f"--rootdir={other}")  # its own reuse folder: made there
    assert alone["reused_from"] is None and [p.name for p in (other / ".simplefsdp" / "reuse").glob("b*")] == [
        kept.name
    ]  # the same key in both folders


def test_a_jobs_key_names_no_rootdir_or_reuse_folder_but_every_other_file(tmp_path):
    """titan's jobs run in the rootdir's .simplefsdp and name its generated assets and a kept seed: the same job in
    two rootdirs (or with two reuse folders) has one key; a file named outside them is hashed, path and bytes."""
    from pytest_simplefsdp.store.reuse import content_key
    from pytest_simplefsdp.targets.base import RankCommand

    data = tmp_path / "tokenizer.json"
    data.write_text("v1")

    def key(rootdir, reuse=None, named=data):
        cache = tmp_path / rootdir / ".simplefsdp"
        kept = reuse or cache / "reuse"
        (cache / "assets").mkdir(parents=True, exist_ok=True)
        (cache / "assets" / "c4.json").write_text(rootdir)  # made by a generator the command names: not hashed
        env = {"DATASET": str(cache / "assets" / "c4.json"), "TOKENIZER": str(named)}
        argv = ["python", "-m", "torchtitan.train", "--checkpoint.initial_load_path", str(kept / "seed-llama3-0123")]
        return content_key(RankCommand(argv, env, cwd=str(cache)), {"@reuse": kept, "@cache": cache})

    assert key("a") == key("b") == key("c", reuse=tmp_path / "shared") == key("d", reuse=tmp_path / "shared")
    other = tmp_path / "other.json"
    other.write_text("v1")
    assert key("a", named=other) != key("a")  # another file's path
    data.write_text("v2")
    assert key("b") != key("a", named=other) and len({key("a"), key("b")}) == 1  # its bytes
