"""The fork server behind ``--simplefsdp-launcher fork`` (started as ``python -m pytest_simplefsdp.launch.forkserver``).

It imports the target's modules once (what the entry module imports at its top, e.g. torch and
torchtitan, and the config module: most of a CPU cell's wall time), then for each cell forks one child
per rank. A child starts a new session, sends its output to its rank log, takes the environment
torchrun would give it and runs the entry module as ``__main__``; every cell gets fresh forks, so nothing a cell changes reaches the next one. The
server itself never initialises CUDA, thread pools or process groups: importing torch does none. A forked child
holds only the thread that forked it, so a lock another thread of the server held stays held in the child: the
server keeps to one thread (pyarrow, which torchtitan's data loading imports, starts jemalloc's background thread
when it loads, unless ``JE_ARROW_MALLOC_CONF`` says not to) and names any other thread it holds when it forks.

Protocol (JSON lines): stdin takes ``{"module", "args", "envs", "logs", "cwd"}`` (one environment and one
log per rank, made by the launcher as for its other ranks); stdout answers ``{"pids": [...]}`` and then ``{"rank": r, "code": c}`` per finished rank.
"""

import faulthandler
import importlib
import json
import os
import runpy
import signal
import sys
import traceback

from pytest_simplefsdp.launch import reaper


def _child(req, rank, server):
    """A rank, in a forked child: whatever the target does (even closing stdout and stderr before it
    raises), the child leaves through os._exit with the rank's code and never returns into the server. Before
    that it does what a reaper does for the other launchers' ranks (reaper.py): it names in its log, and
    kills, every process it leaves behind."""
    code = 1
    try:
        code = _rank(req, rank, server)
    finally:
        try:
            lines = reaper.sweep()
            if lines:
                fd = os.open(req["logs"][rank], os.O_WRONLY | os.O_APPEND)
                os.write(fd, ("\n" + "\n".join(lines) + "\n").encode())
                os.close(fd)
        finally:
            os._exit(code)


def _rank(req, rank, server):
    os.setsid()
    reaper.subreaper()  # what the rank starts and leaves comes back here (see _child)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # die with the server
    except (OSError, AttributeError):
        pass
    if os.getppid() != server:
        os._exit(1)
    fd = os.open(req["logs"][rank], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    startup = getattr(sys.modules.get("sitecustomize"), "STARTUP_LINES", [])  # e.g. the CPU shim's patches
    for line in startup:  # printed once by the server: every rank's log says it, as a fresh interpreter's would
        os.write(2, (line + "\n").encode())
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.enable(all_threads=True)  # what PYTHONFAULTHANDLER=1 gives a fresh rank: a stack on SIGSEGV
    os.environ.clear()
    os.environ.update(req["envs"][rank])
    _reread_environment()
    for after_fork in getattr(sys.modules.get("sitecustomize"), "AFTER_FORK", []):  # e.g. the probe's own record
        after_fork()
    if req.get("cwd"):
        os.chdir(req["cwd"])
    sys.argv = [req["module"], *req["args"]]
    code = 0
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a rank's error is its exit code and its log
        code = 1
        try:
            with os.fdopen(os.dup(2), "w") as err:  # fd 2, even if the target closed sys.stderr
                traceback.print_exc(file=err)
        except OSError:
            pass
    for at_exit in getattr(sys.modules.get("sitecustomize"), "AT_EXIT", []):  # e.g. the footprint's record
        try:
            at_exit()
        except Exception:  # noqa: BLE001 - a record that cannot be written is missing, the rank's code stands
            traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the target
            pass
    return code


def _reread_environment():
    """What torch read from the environment when the server imported it, read again with the rank's, as a fresh
    interpreter would have: its logging settings, TORCH_TRACE (the cell's compile trace) among them."""
    internal = sys.modules.get("torch._logging._internal")
    if internal is not None and hasattr(internal, "_init_logs"):
        internal.LOG_TRACE_HANDLER = None  # a singleton made with the server's (unset) trace folder
        internal._init_logs()


def _say(obj):
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def _entry_imports(module):
    """The absolute imports at the top of the entry module's source. The server imports these, not the
    entry module itself: a script whose body runs at import (no ``__main__`` guard) must run in its
    ranks, never inside the server."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def threads():
    """The names of this process's other OS threads (a forked child gets none of them)."""
    try:
        tasks = sorted(os.listdir("/proc/self/task"), key=int)
    except OSError:
        return []
    names = []
    for task in tasks:
        if int(task) != os.getpid():
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                continue
    return names


def main():
    entry, *preload = sys.argv[1:]
    for name in _entry_imports(entry):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank that imports it will report it
            pass
    for name in preload:
        importlib.import_module(name)
    _say({"ready": True})
    server = os.getpid()
    for line in sys.stdin:
        req = json.loads(line)
        pids, others = {}, threads()
        for rank in range(len(req["envs"])):
            pid = os.fork()
            if pid == 0:
                _child(req, rank, server)  # never returns
            pids[pid] = rank
        _say({"pids": list(pids), "threads": others})
        while pids:
            pid, status = os.wait()
            if pid in pids:
                _say({"rank": pids.pop(pid), "code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
