"""Step 3 on a cluster: every cell is one SLURM job step (``--simplefsdp-launcher=slurm``).

One ``srun`` per cell starts one task per node; each task runs torchrun for that node's ranks with
torchrun's static multi-node rendezvous (node rank = the step's SLURM_NODEID, master = the step's
first node), so the ranks see the same environment as under the torchrun launcher and write their
logs to the same per-cell folder (which must be on a file system the nodes share).

SLURM owns the processes, so this launcher never signals them itself: a stack dump is
``scancel --signal=USR1`` on the step (torchrun ignores it, the ranks' faulthandler prints), a stop is
``scancel`` of the step, and a cell still queued is withdrawn by stopping its srun. The cell's
timeout counts from the moment the step starts; the time in the queue has its own limit.

Its options and its answer to ``pytest_simplefsdp_make_launcher`` are a pytest plugin of their own
(slurm_plugin.py, entry point ``simplefsdp_slurm``), as any other plugin's launcher could be.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from .procs import cell_token, die_with_parent, interpreter, quote_env, rank_env, spawn
from .reaper import reaped
from .spec import LaunchOutcome, LaunchSpec
from .supervisor import STACK_DUMP_WAIT_S, Supervisor, marked_ranks
from .torchrun import TorchrunLauncher, read_root_cause

GPUS_PER_NODE = 8  # a GPU cell's default ranks per node
STEP_LINE = "simplefsdp-step"
STEP = re.compile(rf"(?m)^{STEP_LINE} (\d+)\.(\d+) node (\d+) of (\S+)")
QUEUED = re.compile(r"srun: job (\d+) queued and waiting for resources")
CANCELLED = re.compile(r"(?m)^.*\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))?(?: \*\*\*|$).*$")
SRUN_ERROR = re.compile(r"(?m)^srun: (?:error|fatal): (.*)$")
TASK_FAILED = re.compile(r"(?m)^srun: error: \S+: task \d+: ")  # then --kill-on-bad-exit cancels the step
DUMPED = "(most recent call first)"  # what faulthandler prints for each thread
SCANCEL_WAIT_S = 30.0  # srun's own end after scancel (SLURM waits KillWait between SIGTERM and SIGKILL)
TASK_VARS = {"@NODE@": '"$SLURM_NODEID"', "@ADDR@": '"$addr"'}  # known only on the node


def _shell_word(word):
    """A word of the task's script: quoted, with the TASK_VARS placeholders left to the shell."""
    return "".join(TASK_VARS.get(p) or shlex.quote(p) for p in re.split("(@NODE@|@ADDR@)", word) if p)


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    extra: list = field(default_factory=list)  # more srun options, as words
    ranks_per_node: int | None = None  # None: GPU cells GPUS_PER_NODE per node, CPU cells on one node
    queue_timeout: float = 3600.0


def check_cluster(options: SlurmOptions):
    """None when srun can be used here, else why not (for a usage error before any cell runs)."""
    for tool in ("srun", "sinfo", "squeue", "scancel"):
        if not shutil.which(tool):
            return f"--simplefsdp-launcher=slurm: {tool!r} is not on PATH (the SLURM client commands are needed)"
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "--simplefsdp-launcher=slurm: sinfo did not answer within 60 s (is slurmctld reachable?)"
    if res.returncode:
        return f"--simplefsdp-launcher=slurm: sinfo failed: {res.stderr.strip() or res.returncode}"
    partitions = res.stdout.split()
    if options.partition and options.partition not in partitions:
        return (
            f"--simplefsdp-slurm-partition: no partition {options.partition!r} on this cluster; "
            f"sinfo lists: {', '.join(partitions) or 'none'}"
        )
    return None


def rank_logs(log_dir, nodes, per_node):
    """Global rank -> its torchrun log files; node K's torchrun logs its local ranks under node<K>/."""
    return {
        k * per_node + r: sorted((log_dir / "torchrun" / f"node{k}").glob(f"*/attempt_*/{r}/std*.log"))
        for k in range(nodes)
        for r in range(per_node)
    }


class SlurmLauncher:
    name = "slurm"
    remote = True  # SLURM, not this host, places the ranks: this host's GPU and rank budgets do not apply

    def __init__(self, options: SlurmOptions | None = None):
        self.options = options or SlurmOptions()
        self.active: set = set()  # supervisors of the steps now running (close() cancels them)
        self.lock = threading.Lock()

    def layout(self, spec: LaunchSpec):
        """(nodes, ranks per node) of a cell; ValueError when its ranks do not split evenly."""
        most = self.options.ranks_per_node or (GPUS_PER_NODE if spec.device == "cuda" else spec.nproc)
        nodes = -(-spec.nproc // most)
        if spec.nproc % nodes:
            raise ValueError(
                f"{spec.nproc} ranks do not split evenly over {nodes} nodes of at most {most} ranks "
                f"(--simplefsdp-slurm-ranks-per-node)"
            )
        return nodes, spec.nproc // nodes

    def srun_argv(self, spec: LaunchSpec):
        nodes, per_node = self.layout(spec)
        o = self.options
        argv = [
            "srun",
            f"--job-name=simplefsdp:{spec.cell_id}",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            "--ntasks-per-node=1",
            f"--time={math.ceil(spec.timeout / 60) + 1}",  # behind our own timeout
            "--signal=USR1@30",  # stack dumps before SLURM's own limit, should it come first
            "--kill-on-bad-exit=1",
            "--export=ALL",
        ]
        argv += [f"--partition={o.partition}"] * bool(o.partition) + [f"--account={o.account}"] * bool(o.account)
        if spec.device == "cuda":
            argv.append(f"--gres=gpu:{per_node}")
        argv += o.extra
        torchrun = TorchrunLauncher().torchrun_argv(
            spec,
            nproc=per_node,
            addr="@ADDR@",
            log_dir=spec.log_dir / "torchrun" / "node@NODE@",
            nodes=[f"--nnodes={nodes}", "--node-rank=@NODE@"],
        )
        head = (
            "addr=127.0.0.1"
            if nodes == 1
            # the step's first node, as SLURM reaches it
            else 'head=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n1); '
            'addr=$(scontrol show node "$head" | sed -n "s/.* NodeAddr=\\([^ ]*\\).*/\\1/p")'
        )
        reaper = reaped([], interpreter(spec.command.argv))[:-1]  # around torchrun too: nothing outlives the step
        script = (
            f'trap "" USR1; echo "{STEP_LINE} $SLURM_JOB_ID.$SLURM_STEP_ID node $SLURM_NODEID of '
            f'$SLURM_STEP_NODELIST"; {head}; exec ' + " ".join(map(_shell_word, reaper + torchrun))
        )
        return argv + ["bash", "-c", script]

    def reproducer(self, spec: LaunchSpec):
        try:
            argv = self.srun_argv(spec)
        except ValueError as e:
            return f"# not runnable under SLURM: {e}"
        cd = f"cd {shlex.quote(spec.command.cwd)} && " if spec.command.cwd else ""
        return cd + " ".join(filter(None, [quote_env(spec.command.env), shlex.join(argv)]))

    def launch(self, spec: LaunchSpec) -> LaunchOutcome:
        token = cell_token(spec)
        out = LaunchOutcome(reproducer=self.reproducer(spec), port=spec.port, launcher=self.name)
        try:
            argv = self.srun_argv(spec)
        except ValueError as e:
            out.launch_error = str(e)
            return out
        nodes, per_node = self.layout(spec)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        out.launcher_log = spec.log_dir / "srun.log"
        with open(out.launcher_log, "wb") as f:
            try:
                proc = spawn(
                    argv,
                    env=rank_env(spec, token),
                    cwd=spec.command.cwd,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGTERM),
                )  # srun stops its step
            except OSError as e:
                out.launch_error = f"cannot start srun: {e.strerror or e}"
                return out
            step = _StepSupervisor(spec, token, out, proc, self.options.queue_timeout, per_node)
            with self.lock:
                self.active.add(step)
            try:
                step.run({"srun": proc}, alive_ranks=step.stuck_ranks)
            finally:
                with self.lock:
                    self.active.discard(step)
        out.rank_logs = rank_logs(spec.log_dir, nodes, per_node)  # torchrun made them while the step ran
        code = out.exit_codes.pop("srun", None)
        step.read_slurm_verdict(code)
        if not out.launch_error:
            read_root_cause(out, code)
        return out

    def close(self):
        """The session ends (or was interrupted): cancel every step still running."""
        with self.lock:
            steps = list(self.active)
        for step in steps:
            step.kill(grace=1.0)


class _StepSupervisor(Supervisor):
    """The supervisor's loop over one srun; stack dumps and stops go through SLURM."""

    def __init__(self, spec, token, outcome, proc, queue_timeout, per_node):
        super().__init__(spec, token, outcome, finder=lambda: [])
        self.proc, self.queue_timeout, self.per_node = proc, queue_timeout, per_node
        self.step = self.job = self.nodes = None
        self.begun, self.started = time.monotonic(), None  # srun started; the step started
        self.cancelled = False  # we stopped it (timeout, log flood, Ctrl-C)
        self.read_at = -1e9
        self.sizes = {}  # rank log -> its size when the stack dump signal went out

    def _scan(self, now, force=False):
        """Read srun's output for the job id (queued) and the step id (started)."""
        if self.step is not None or (now - self.read_at < 0.25 and not force):
            return
        self.read_at = now
        text = self.outcome.launcher_log.read_text(errors="replace")
        m = STEP.search(text)
        if m:
            self.step, self.job, self.nodes = f"{m.group(1)}.{m.group(2)}", m.group(1), m.group(4)
            self.started = now
        elif q := QUEUED.search(text):
            self.job = q.group(1)

    def deadline(self, start, now):
        self._scan(now)
        if self.step is None:
            return start + self.queue_timeout
        return self.started + self.spec.timeout

    def on_deadline(self, procs, alive_ranks):
        if self.step is not None:
            return super().on_deadline(procs, alive_ranks)
        reason = ""
        if self.job:
            res = subprocess.run(["squeue", "-h", "-j", self.job, "-o", "%r"], capture_output=True, text=True)
            reason = f" (job {self.job} pending: {res.stdout.strip() or 'gone'})"
        self.outcome.launch_error = f"SLURM did not start the cell within {self.queue_timeout:.0f} s{reason}"
        self.kill()

    def _rank_logs(self):
        return rank_logs(self.spec.log_dir, self.spec.nproc // self.per_node, self.per_node)

    def dump_stacks(self):
        self.sizes = {p: p.stat().st_size for paths in self._rank_logs().values() for p in paths}
        subprocess.run(["scancel", f"--signal={signal.SIGUSR1.name[3:]}", self.step], capture_output=True)
        time.sleep(STACK_DUMP_WAIT_S)

    def stuck_ranks(self):
        """The ranks still running at the timeout: those that printed a stack after the dump signal, and those
        whose start-up shim still marks them running (a rank that ignores SIGUSR1 prints nothing)."""
        return sorted(set(self.dumped_ranks()) | marked_ranks(self.spec.log_dir, "running"))

    def dumped_ranks(self):
        """The ranks that printed a stack after the dump signal: they were still running."""
        alive = []
        for r, paths in sorted(self._rank_logs().items()):
            new = b""
            for path in paths:
                with open(path, "rb") as f:
                    f.seek(self.sizes.get(path, 0))
                    new += f.read()
            if DUMPED.encode() in new:
                alive.append(r)
        return alive

    def kill(self, grace=1.0):
        """Stop the step through SLURM (a queued cell: stop its srun, which withdraws the request)."""
        if self.proc.poll() is None:
            self.cancelled = True
            self._scan(time.monotonic(), force=True)
            if self.step is not None:
                subprocess.run(["scancel", self.step], capture_output=True)
            else:
                self.proc.terminate()
            try:
                self.proc.wait(SCANCEL_WAIT_S + grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return []  # SLURM cleans up the step's processes; none of them is ours to report

    def read_slurm_verdict(self, code):
        """What SLURM said about the step: not started, cancelled by someone else, or out of time."""
        out = self.outcome
        text = out.launcher_log.read_text(errors="replace")
        self._scan(time.monotonic(), force=True)
        if self.step:
            queued = max(0.0, (self.started or self.begun) - self.begun)
            out.notes.append(f"SLURM step {self.step} on {self.nodes} (queued {queued:.1f} s)")
            out.wall = max(0.0, out.wall - queued)  # the cell's time, as under the other launchers
        cancelled, task_failed = CANCELLED.search(text), TASK_FAILED.search(text)
        if out.launch_error or out.timed_out or out.log_flood:
            return
        if cancelled and task_failed and task_failed.start() < cancelled.start():
            cancelled = None  # SLURM stopped the other nodes because a task failed: the ranks tell why
        if cancelled and cancelled.group(1) == "TIME LIMIT":
            out.timed_out = True
            out.stuck_ranks = self.stuck_ranks()
            out.notes.append(f"SLURM's time limit ended the step: {cancelled.group(0).strip()}")
        elif cancelled and not self.cancelled:
            out.launch_error = f"SLURM cancelled the step: {cancelled.group(0).strip()}"
        elif self.step is None and code:
            errors = SRUN_ERROR.findall(text)
            said = errors[0] if errors else (text.strip().splitlines() or [f"srun exited with code {code}"])[-1]
            nodes = self.spec.nproc // self.per_node
            out.launch_error = (
                f"SLURM did not run the cell ({nodes} node{'s' * (nodes > 1)} of {self.per_node} "
                f"rank{'s' * (self.per_node > 1)}): {said}"
            )
