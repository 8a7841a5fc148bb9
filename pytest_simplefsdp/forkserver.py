"""The fork server behind ``--simplefsdp-launcher fork`` (started as ``python -m pytest_simplefsdp.forkserver``).

It imports the target's modules once (torch, torchtitan, the config module: most of a CPU cell's
wall time), then for each cell forks one child per rank. A child starts a new session, sends its
output to its rank log, takes the environment torchrun would give it and runs the entry module as
``__main__``; every cell gets fresh forks, so nothing a cell changes reaches the next one. The
server itself never initialises CUDA, thread pools or process groups: importing torch does none.

Protocol (JSON lines): stdin takes ``{"nproc", "first_rank", "module", "args", "env", "logs",
"cwd"}``; stdout answers ``{"pids": [...]}`` and then ``{"rank": r, "code": c}`` per finished rank.
"""

import faulthandler
import importlib
import json
import os
import runpy
import signal
import sys
import traceback


def _child(req, rank, server):
    os.setsid()
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
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.clear()
    os.environ.update(req["env"])
    global_rank = req["first_rank"] + rank
    os.environ.update(RANK=str(global_rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(global_rank),
                      WORLD_SIZE=str(req["nproc"]), LOCAL_WORLD_SIZE=str(req["nproc"]),
                      ROLE_WORLD_SIZE=str(req["nproc"]))
    if req.get("cwd"):
        os.chdir(req["cwd"])
    sys.argv = [req["module"], *req["args"]]
    code = 0
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a rank's error is its exit code and its log
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _say(obj):
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def main():
    for name in sys.argv[1:]:
        importlib.import_module(name)
    _say({"ready": True})
    server = os.getpid()
    for line in sys.stdin:
        req = json.loads(line)
        pids = {}
        for rank in range(req["nproc"]):
            pid = os.fork()
            if pid == 0:
                _child(req, rank, server)
            pids[pid] = rank
        _say({"pids": list(pids)})
        while pids:
            pid, status = os.wait()
            if pid in pids:
                _say({"rank": pids.pop(pid), "code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
