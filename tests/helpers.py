"""What the plugin's tests share: fake matrices for the fake rank target, the known-failures file of its `fail`
mode, the report tool as a user runs it, the records a run wrote, and this session's processes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from pytest_simplefsdp.launch.procs import MARKER

FAKE_RANK = Path(__file__).parent / "fakes" / "fake_rank.py"
DATA = Path(__file__).parent / "data"  # real logs and files the tests read


def fake_matrix(modes=("pass",), ranks=(2,), extra="", args="", steps=3, timeout=30):
    """A matrix file for the fake rank target: one axis `mode`, one degree axis `ranks`."""
    return textwrap.dedent(f"""\
        profile: fake
        target:
          command: ["{{python}}", "{FAKE_RANK}", "--mode", "{{mode}}", "--dump", "{{dump_folder}}",
                    "--steps", "{{steps}}" {args}]
        device: cpu
        world_sizes: {list(ranks)}
        degrees: [ranks]
        timeout: {timeout}
        settings:
          steps: {steps}
        axes:
          mode: {list(modes)}
          ranks: {list(ranks)}
        ids:
          ranks: {{prefix: r}}
        """) + textwrap.dedent(extra)


def module_matrix(modes, **kw):
    """The fake rank as `python -m fake_rank`, the form the fork server can preload and fork."""
    text = fake_matrix(modes=modes, **kw).replace(f'"{{python}}", "{FAKE_RANK}"', '"{python}", "-m", "fake_rank"')
    return text.replace("target:\n", 'target:\n  env: {PYTHONPATH: "%s"}\n' % FAKE_RANK.parent)


NUMERICS = """\
numerics:
  global_batch_size: 8
  baseline: {mode: pass}
  lanes:
    - name: close
      match: [{mode: perturb}, {mode: nan}]
      rtol: 1.0e-5
      atol: 1.0e-5
    - name: exact
"""  # the fake target's numerics: perturb and nan cells compared with pass


KF = """\
- id: fake-known
  when: {mode: fail}
  error: 'fake failure'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/pull/1529
  reason: a known fake failure
"""  # a known-failures file for the fake target's `fail` mode


KF_EQ = """\
# a comment that survives updates
- id: fake-eq
  when: {mode: fail, ranks: ">1"}
  error: 'Eq\\(uN \\+ uN, N\\)'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/pull/1529
  reason: unbacked symbol equality in EP token dispatch
"""  # the EP token dispatch failure of the seed era, with a comment the update command must keep


def report_tool(*args, cwd=None):
    """python -m pytest_simplefsdp.report, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def interruptible():
    """preexec_fn of a pytest run that a test interrupts: SIGINT as a terminal delivers it (a background
    job of a non-interactive shell, as CI may be, starts with SIGINT ignored, and Python keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


BASETEMP = []  # this test session's tmp root: the runs its tests start live under it


def ours(p):
    """Whether a process belongs to a run this test session started (its cell's evidence folder or its working
    directory lies under the session's tmp root), not to another job on the machine with the same cell ids."""
    if not BASETEMP:
        return True
    env, root = p.environ(), os.path.join(BASETEMP[0], "")  # (a sibling /tmp/bt2 is not under /tmp/bt)
    return any(os.path.join(str(x), "").startswith(root) for x in (env.get("SIMPLEFSDP_EVIDENCE_DIR", ""), p.cwd()))


def marked(prefix):
    """Live processes of this session's runs whose cell marker starts with ``prefix`` (a cell id, or
    "forkserver:")."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER, "").startswith(prefix) and ours(p):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def lingering(*prefixes, within=15.0):
    """The marked processes (of any of ``prefixes``) still alive after waiting up to ``within`` seconds for them to
    go: a process just sent SIGKILL can stay listed for seconds on a loaded machine (2 cores, two xdist workers);
    one nobody killed stays for good."""
    deadline = time.monotonic() + within
    while True:
        found = [p for prefix in prefixes for p in marked(prefix)]
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def run_doc(path, index=0):
    """The run document (--simplefsdp-json) at ``path``: its ``index``-th matrix's meta, cells, dropped, ..."""
    return json.loads(Path(path).read_text())["runs"][index]


def cells_of(path, index=0):
    """cell id -> cell record of a run document."""
    return {c["id"]: c for c in run_doc(path, index)["cells"]}


def launcher_ready(request, launcher):
    """For a test parametrized over launchers: SLURM up (or the test skipped) when it is the slurm one."""
    if launcher == "slurm":
        request.getfixturevalue("slurm")


def slurm_jobs(wait=20.0):
    """(job id, name, state) of the plugin's jobs in SLURM's queue that runs of this test session submitted
    (their working directory lies under its tmp root; another session on the cluster has its own), once
    ending ones had `wait` s to go."""
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T|%Z"], capture_output=True, text=True).stdout
        jobs = [
            tuple(line.split("|")[:3])
            for line in out.splitlines()
            if "|simplefsdp:" in line
            and (not BASETEMP or os.path.join(line.rpartition("|")[2], "").startswith(os.path.join(BASETEMP[0], "")))
        ]
        if not jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


def fake_wheel(folder, name, version, body=""):
    """A tiny pure-Python wheel ``name==version`` in ``folder`` (a stand-in for torch in an environment of a version
    set: the fake rank reads its version): uv installs it from a find-links folder, offline, in a second."""
    import base64
    import hashlib
    import zipfile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n{body}",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: pytest-simplefsdp tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip('=')},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ] + [f"{info}/RECORD,,"]
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name_, text in {**files, f"{info}/RECORD": "\n".join(record) + "\n"}.items():
            z.writestr(name_, text)
    return path


GIT = ["git", "-c", "user.email=tests@pytest-simplefsdp", "-c", "user.name=pytest-simplefsdp tests"]

# bugs planted into torchtitan main (the bundle's commits) by the main tier and the bisection demonstration:
# (file, the line they go after, the lines, what the commit says)
PLANT_EP = (
    "torchtitan/experiments/graph_trainer/deepseek_v3/parallelize.py",
    "    annotate_deepseekv3(model)\n",
    "    if parallel_dims.ep > 1:\n        raise RuntimeError('planted: expert parallelism refused')\n",
    "planted: graph_trainer deepseek_v3 refuses EP",
)
PLANT_TRACE = (
    "torchtitan/experiments/graph_trainer/llama3/parallelize.py",
    "    annotate_llama(model)\n",
    "    if compile_config.mode == 'aot_fx_trace':\n"
    "        raise RuntimeError('planted: aot_fx_trace refused for llama3')\n",
    "planted: graph_trainer llama3 refuses aot_fx_trace",
)


# the PR of issue 45 on top of PLANT_EP's base: the same refusal, raised another way (a new failure, not broken trunk)
PLANT_EP_OTHER = (
    PLANT_EP[0],
    PLANT_EP[2],
    "    if parallel_dims.ep > 1:\n        raise ValueError('expert parallel "
    "all-to-all: split sizes disagree across ranks')\n",
    "planted: EP refused with another error",
)


# issue 45's numerics PR: every RMSNorm's default eps 1e-5 -> 1e-3 (both models, every layout alike)
PLANT_EPS = (
    "torchtitan/models/common/nn_modules.py",
    'class RMSNorm(nn.RMSNorm, Module):\n    """Configurable nn.RMSNorm."""\n\n'
    "    @dataclass(kw_only=True, slots=True)\n    class Config(Module.Config):\n"
    "        normalized_shape: int\n        eps: float = 1e-5\n",
    'class RMSNorm(nn.RMSNorm, Module):\n    """Configurable nn.RMSNorm."""\n\n'
    "    @dataclass(kw_only=True, slots=True)\n    class Config(Module.Config):\n"
    "        normalized_shape: int\n        eps: float = 1e-3\n",
    "planted: RMSNorm eps 1e-5 -> 1e-3",
)


def plant(repo, bug, branch=None, replace=False) -> str:
    """Commit ``bug`` (a PLANT_* tuple) into a torchtitan checkout (on a new ``branch`` from HEAD, where given): its
    lines after the anchor line, or (``replace``) in its place; returns the new commit (12 hex digits)."""
    path, anchor, code, message = bug
    if branch:
        subprocess.run([*GIT, "-C", str(repo), "checkout", "-qb", branch], check=True)
    file = Path(repo) / path
    text = file.read_text()
    assert anchor in text, f"{path}: the line to plant after is gone: {anchor!r}"
    file.write_text(text.replace(anchor, code if replace else anchor + code, 1))
    return commit_all(repo, message, new_files=False)  # (an editable install's build files stay out)


def commit_all(repo, message, new_files=True) -> str:
    """Commit a checkout's working tree, new files too unless ``new_files`` is False (nothing changed: an empty
    commit); the commit's 12 hex digits."""
    subprocess.run([*GIT, "-C", str(repo), "add", "-A" if new_files else "-u"], check=True, capture_output=True)
    subprocess.run(
        [*GIT, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", message], check=True, capture_output=True
    )
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def plant_in_history(repo, at, bug, branch="planted") -> tuple[str, str]:
    """Rewrite a torchtitan checkout's history with ``bug`` planted right after commit ``at``: a new ``branch`` of
    ``at``, the planted commit, then every later first-parent commit of HEAD cherry-picked on top, checked out.
    Returns (the planted commit, the new tip), 12 hex digits each."""
    tip = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    later = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--reverse", "--first-parent", f"{at}..{tip}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    subprocess.run([*GIT, "-C", str(repo), "checkout", "-q", at], check=True)
    planted = plant(repo, bug, branch=branch)
    for commit in later:
        subprocess.run(
            [*GIT, "-C", str(repo), "cherry-pick", "--allow-empty", "-X", "theirs", commit],
            check=True,
            capture_output=True,
        )
    new_tip = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return planted, new_tip


def fake_checkout(repo):
    """``repo`` made a fake torchtitan checkout, its stand-in package built by uv's own backend (offline)."""
    (repo / "torchtitan").mkdir(parents=True, exist_ok=True)
    (repo / "torchtitan" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [project]
        name = "torchtitan"
        version = "0.2.2"
        [build-system]
        requires = ["uv_build>=0.8,<1"]
        build-backend = "uv_build"
        [tool.uv.build-backend]
        module-root = ""
        """)
    )
    (repo / ".gitignore").write_text("*.yaml\n*.json\nruns/\n")
    subprocess.run([*GIT, "init", "-q", "-b", "main", str(repo)], check=True)
