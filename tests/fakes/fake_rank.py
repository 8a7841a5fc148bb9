"""A fake rank for the plugin's own tests: behaves like a training rank, fails on demand.

Ranks meet at a file barrier in --dump after every step (the stand-in for a collective), so a
rank that stops makes its peers wait, as a missed all-reduce would. Modes:
  pass       every rank logs `step: N  loss: X` for --steps steps and exits 0
  fail       --rank raises --error (default RuntimeError) at step --at-step (2)
  hang       --rank stops before the step-2 barrier; its peers wait forever
  segv       --rank dies of SIGSEGV at step 2          kill      --rank SIGKILLs itself
  exit3      --rank calls os._exit(3) at step 2         noresult  every rank exits 0, no steps
  flood      --rank writes --flood-mb MB of log lines    orphan    rank 0 leaves a detached child
  nan        losses become NaN at step 2                 perturb   loss of step >= 2 off by --delta
  zerograd   grad_norm is 0.0000 from step 2 (a step that trained nothing)
  failignore rank 0 raises at step --at-step while --rank ignores SIGTERM (and waits for rank 0 forever)
  usr1ignore --rank ignores SIGUSR1 (no stack dump) and hangs like `hang`
  closeraise --rank closes its stdout and stderr, then raises at step --at-step
  daemon     rank 0 double-forks a setsid daemon that execs `sleep 97` with an empty environment
  ignoretp   like pass, but every rank records a TP mesh of size 1 whatever --tp asked
  leave      --rank exits with code 0 at step --at-step, before its barrier: its peers wait for it forever
With SIMPLEFSDP_INVARIANTS=1 every rank records each step's optimizer invariants as the shim's training probe does
(steps.rank<RANK>.jsonl: a replicated parameter `w`, a sharded one `s`, one optimizer and scheduler step each);
from step --at-step on, --rank breaks one:
  staleupdate  its `w` does not change      replicadrift  its copy of `w` differs from the others'
  lrskew       its learning rate differs    extrastep     it runs one more optimizer step
  bigupdate    its piece of `s` moves twice as far (the update norm differs; every invariant holds)
  norecord     it records nothing (its probe did not run)
Versions (a version set's environment, where "torch" may be a stand-in wheel): --breaks-from V fails --rank at
--at-step from torch V on; --fixed-from V fails it before torch V (a fix); --other-at V fails it with another error on torch V; --flaky-at V fails every second run.
A version set's rank imports the packages it pins (SIMPLEFSDP_PROVES), as a real rank imports torch and torchtitan.
--torchtitan-says: where the environment's "torchtitan" (a stand-in package of a fake git checkout) has a file
broken.txt, it decides the mode: a line `MODE` fails that mode as `fail` does, `MODE other` with another error,
`MODE flaky` every second run, `MODE shift` passes with losses from step 2 off by --delta (numerics moved); a mode
it does not list passes. Without that file (the torchtitan pytest runs with:
the pull request's side), the file $FAKE_TORCHTITAN_SAYS decides, where it is set; else the mode acts as given.
With --gpu MODEL every rank records the machine a GPU rank's shim records (that GPU, a driver, a CUDA).
A compiled rank (--compile, not eager) runs --graph-passes (a comma list, less --passes-off: names, or * for all;
--mandatory ones run whatever it says) and records them as the shim records graph_trainer's (effects.graph_passes);
--breaks-with A+B fails --rank at --at-step where passes A and B both ran (a miscompile), inside the last of them;
--breaks-with trace fails it wherever it is compiled (the trace itself, no pass needed).
With --tp N every rank records `{"mesh": {"tp": N}}` in $SIMPLEFSDP_EVIDENCE_DIR/rank<RANK>.json, as the
shim's probe does for torchtitan. SIMPLEFSDP_MUTANT (the mutation tier) names a bug the fake re-injects,
recorded as `{"mutant": {"name": ..., "applied": 1}}` like the shim's:
  loss_shift  losses from step 2 off by 0.5     crash  rank 1 raises at step 2
  noop        acts, changes nothing (survives)  idle   finds nothing to change (records nothing)
"""

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time


def barrier(folder, step, rank, world):
    open(os.path.join(folder, f"step{step}.rank{rank}"), "w").close()
    while not all(os.path.exists(os.path.join(folder, f"step{step}.rank{r}")) for r in range(world)):
        time.sleep(0.02)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="pass")
    p.add_argument("--rank", type=int, default=1, help="the rank that misbehaves (-1: the last)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dump", required=True)
    p.add_argument("--error", default="RuntimeError: fake failure on purpose")
    p.add_argument("--flood-mb", type=int, default=64)
    p.add_argument("--delta", type=float, default=1e-3)
    p.add_argument("--startup", type=float, default=0.0, help="seconds to sleep before step 1")
    p.add_argument("--at-step", type=int, default=2, help="the step at which --rank misbehaves")
    p.add_argument("--tp", type=int, default=None, help="the TP degree asked; recorded as evidence")
    p.add_argument("--gpu", default=None, help="a GPU's model: recorded as the shim records a GPU rank's machine")
    p.add_argument("--flag", default=None, help="porttaken, segvonce: the file whose absence makes this try fail")
    p.add_argument("--checkpoint", action="store_true", help="resume from <dump>/checkpoint, save there at the end")
    p.add_argument("--no-load", action="store_true", help="with --checkpoint: ignore the saved one (a broken resume)")
    p.add_argument("--needs", default=None, help="a file a step before the cell must have written (its artifact)")
    p.add_argument(
        "--breaks-from",
        default=None,
        help="from this torch version on (its environment's, read from its "
        "metadata), --rank raises at --at-step: a regression",
    )
    p.add_argument("--fixed-from", default=None, help="before this torch version, --rank raises at --at-step: a fix")
    p.add_argument("--other-at", default=None, help="on exactly this torch version, --rank raises another error")
    p.add_argument(
        "--flaky-at",
        default=None,
        help="on exactly this torch version, every second run fails (a file beside the dump folders counts them)",
    )
    p.add_argument("--compile", default="eager", help="the compile mode: a compiled rank runs its graph passes")
    p.add_argument("--graph-passes", default="", help="a compiled rank's graph passes, in order (comma list)")
    p.add_argument("--passes-off", default="", help="passes turned off (comma list, * for all but --mandatory)")
    p.add_argument("--mandatory", default="", help="passes that run though turned off (comma list)")
    p.add_argument("--breaks-with", default="", help="PASS[+PASS]: --rank fails where these passes all ran")
    p.add_argument(
        "--torchtitan-says",
        action="store_true",
        help="the stand-in torchtitan's broken.txt decides the mode (see above)",
    )
    a = p.parse_args()
    for name in filter(None, os.environ.get("SIMPLEFSDP_PROVES", "").split(",")):  # what a version set pins: a real
        importlib.import_module(name)  # rank imports its torch and torchtitan, and the start-up shim records them
    shift = False
    if a.torchtitan_says:
        said = torchtitan_says(a.mode)
        if said is not None:
            shift = said == "shift"
            a.mode = "pass" if said in ("pass", "shift") or (said == "flaky" and not said_turn(a.mode)) else "fail"
            if said == "other":
                a.error = "ValueError: another fake error on the base"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = os.path.join(a.dump, "barrier")
    os.makedirs(folder, exist_ok=True)
    started = time.time()
    time.sleep(a.startup)
    target = a.rank if a.rank >= 0 else world + a.rank
    if a.needs and not os.path.exists(a.needs):
        raise RuntimeError(f"no precompiled artifact at {a.needs}")
    if a.needs:
        print(f"[titan] loaded the precompiled artifact {a.needs} as local rank {os.environ['LOCAL_RANK']}", flush=True)
    mutant = os.environ.get("SIMPLEFSDP_MUTANT")
    record = {}
    if a.tp is not None:
        record["mesh"] = {"tp": 1 if a.mode == "ignoretp" else a.tp}
    if mutant and mutant != "idle":
        record["mutant"] = {"name": mutant, "applied": 1}
    ran, breaks = [], [b for b in a.breaks_with.split("+") if b]
    if a.compile != "eager":
        off, mandatory = set(filter(None, a.passes_off.split(","))), a.mandatory.split(",")
        ran = [
            p for p in filter(None, a.graph_passes.split(",")) if p in mandatory or ("*" not in off and p not in off)
        ]
        broken = rank == target and (breaks == ["trace"] or bool(breaks) and all(b in ran for b in breaks))
        record["effects"] = {
            "graph_passes": ran,
            "graph_passes_mandatory": [p for p in mandatory if p in ran],
            "graph_pass_running": breaks[-1] if broken and breaks != ["trace"] else "",
        }
    if a.gpu:  # (canned: shim.provenance.gpu_machine's fields)
        record["machine"] = {"gpu": a.gpu, "driver": "550.54.15", "cuda": "12.8"}
    if record and os.environ.get("SIMPLEFSDP_EVIDENCE_DIR"):
        evidence = os.environ["SIMPLEFSDP_EVIDENCE_DIR"]
        os.makedirs(evidence, exist_ok=True)
        path = os.path.join(evidence, f"rank{rank}.json")
        if os.path.exists(path):  # (what the start-up shim recorded stays: the versions this rank imported)
            with open(path) as f:
                record = {**json.load(f), **record}
        with open(path, "w") as f:
            json.dump(record, f)
    if a.mode == "failignore" and rank == target:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.mode == "usr1ignore" and rank == target:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print(f"fake rank {rank}/{world} pid {os.getpid()} mode {a.mode}", flush=True)
    if a.mode == "porttaken" and not os.path.exists(a.flag):  # the first try loses its port, as a bind race does
        barrier(folder, "portcheck", rank, world)  # every rank saw no flag: this whole try fails
        if rank == 0:
            open(a.flag, "w").close()
        # the flag is down before any rank fails: a failing rank's peers are stopped at once, and a rank 0 stopped
        # before it wrote the flag failed the retry too (seen beside a CPU-heavy job)
        barrier(folder, "flagged", rank, world)
        raise RuntimeError(
            "The server socket has failed to listen on any local network address. [errno: 98 - Address already in use]"
        )
    if a.mode == "noresult":
        return 0
    if a.mode == "daemon" and rank == 0 and os.fork() == 0:  # escapes the process group and the marker
        os.setsid()
        if os.fork() == 0:
            os.execve("/bin/sleep", ["sleep", "97"], {})
        os._exit(0)
    if a.mode == "orphan" and rank == 0:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    first = 1
    saved = os.path.join(a.dump, "checkpoint", "step")
    if a.checkpoint and not a.no_load and os.path.exists(saved):
        first = int(open(saved).read()) + 1
        print(f"Finished loading the checkpoint in 0.01 seconds (step {first - 1})", flush=True)
    torch = installed_version("torch")
    for step in range(first, a.steps + 1):
        me = rank == target and step == a.at_step
        if me and a.breaks_from and older(a.breaks_from, torch) is False:
            raise RuntimeError(f"fake regression: broken since torch {a.breaks_from}")
        if me and a.fixed_from and older(a.fixed_from, torch):
            raise RuntimeError(f"fake bug: fixed in torch {a.fixed_from}")
        if me and a.other_at is not None and a.other_at == torch:
            raise ValueError(f"another fake error on torch {torch}")
        if me and a.flaky_at is not None and a.flaky_at == torch and flaky_turn(a.dump):
            raise RuntimeError(f"fake regression: broken since torch {a.breaks_from}")
        if a.mode == "failignore" and rank == 0 and step == a.at_step:
            raise RuntimeError("fake failure on purpose")
        if me and a.mode == "closeraise":
            sys.stdout.close()
            sys.stderr.close()
            raise RuntimeError("fake failure on purpose")
        if me and a.compile != "eager" and (breaks == ["trace"] or breaks and all(b in ran for b in breaks)):
            raise RuntimeError(f"fake miscompile: {' and '.join(breaks)} broke the graph")
        if mutant == "crash" and rank == 1 and step == 2:
            raise RuntimeError("fake mutant crash")
        if me and a.mode == "fail":
            kind, _, msg = a.error.partition(": ")
            exc = {"RuntimeError": RuntimeError, "ValueError": ValueError, "AssertionError": AssertionError}
            raise exc.get(kind, RuntimeError)(msg)
        if me and a.mode in ("hang", "usr1ignore"):
            time.sleep(3600)
        if me and a.mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if me and a.mode == "segvonce" and not os.path.exists(a.flag):  # a crash of one run only, as under load
            open(a.flag, "w").close()
            os.kill(os.getpid(), signal.SIGSEGV)
        if me and a.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if me and a.mode == "exit3":
            os._exit(3)
        if me and a.mode == "leave":
            return 0
        if me and a.mode == "flood":
            line = "x" * 1023 + "\n"
            for _ in range(a.flood_mb * 1024):
                sys.stdout.write(line)
            sys.stdout.flush()
        loss = 10.0 / step
        if a.mode == "nan" and step >= 2:
            loss = float("nan")
        if (a.mode == "perturb" or shift) and step >= 2:
            loss += a.delta
        if mutant == "loss_shift" and step >= 2:
            loss += 0.5
        grad_norm = 0.0 if a.mode == "zerograd" and step >= 2 else 1.0
        barrier(folder, step, rank, world)
        if os.environ.get("SIMPLEFSDP_INVARIANTS") == "1":
            invariants(a, rank, step, rank == target and step >= a.at_step)
        print(
            f"[titan] 2026-01-01 00:00:00,000 - root - INFO - step: {step:2}  loss: {loss:8.5f}  "
            f"grad_norm: {grad_norm:7.4f}",
            flush=True,
        )
    if a.checkpoint and rank == 0:
        os.makedirs(os.path.dirname(saved), exist_ok=True)
        with open(saved, "w") as f:
            f.write(str(a.steps))
    with open(os.path.join(a.dump, f"times.rank{rank}"), "w") as f:  # for the packing tests
        f.write(f"{started} {time.time()} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    return 0


def torchtitan_says(mode):
    """What the environment's stand-in torchtitan says of ``mode``: pass, fail, other or flaky; None where it says
    nothing (no broken.txt beside its package: found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    folder = list(spec.submodule_search_locations or [])[0] if spec and spec.submodule_search_locations else None
    path = os.path.join(folder, "broken.txt") if folder else None
    if not path or not os.path.exists(path):
        path = os.environ.get("FAKE_TORCHTITAN_SAYS")
    if not path or not os.path.exists(path):
        return None
    SAYS[0] = path
    said = dict((line.split() + ["fail"])[:2] for line in open(path).read().splitlines() if line.strip())
    return said.get(mode, "pass")


def said_turn(mode):
    """`MODE flaky`: every second run of the mode fails (rank 1 counts, in a file beside the says file)."""
    if os.environ["RANK"] != "1":
        return False
    counter = f"{SAYS[0]}.{mode}.count"
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(n + 1))
    return n % 2 == 0


SAYS = [""]  # the file torchtitan_says read


def installed_version(package):
    from importlib import metadata

    try:
        return metadata.version(package).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def older(version, than):
    """Whether ``than`` is older than ``version`` (None: no such package here)."""
    if than is None:
        return None
    return tuple(map(int, than.split("."))) < tuple(map(int, version.split(".")))


def flaky_turn(dump):
    """Every second run of the cell fails: a count kept two folders above the cell's dump folder."""
    counter = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(dump))), "flaky-count")
    if os.environ["RANK"] != "1":
        return False
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(n + 1))
    return n % 2 == 0


def invariants(a, rank, step, broken):
    """This rank's record of the step, as the shim's probe writes it: FQN -> [changed, nonzero grad, lr, hash of
    its bits, piece, squared norm of its update]."""
    if a.mode == "norecord" and rank == (a.rank if a.rank >= 0 else 1):
        return
    lr = 0.001 * (2 if broken and a.mode == "lrskew" else 1)
    w = [
        not (broken and a.mode == "staleupdate"),
        True,
        lr,
        1000 + step + (7 if broken and a.mode == "replicadrift" else 0),
        "",
        0.25,
    ]
    s = [True, True, lr, 50 * rank + step, f"dp={rank}", 1.0 if broken and a.mode == "bigupdate" else 0.25]
    count = step + (1 if broken and a.mode == "extrastep" else 0)
    record = {"step": step, "lr": [lr], "params": {"w": w, "s": s}, "optimizer_steps": count, "scheduler_steps": step}
    os.makedirs(os.environ["SIMPLEFSDP_EVIDENCE_DIR"], exist_ok=True)
    with open(os.path.join(os.environ["SIMPLEFSDP_EVIDENCE_DIR"], f"steps.rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main())
