"""What of the torchtitan checkout a rank executed (``SIMPLEFSDP_FOOTPRINT=<checkout root, or 1>``; it changes
nothing): ``footprint.rank<R>.json`` under $SIMPLEFSDP_EVIDENCE_DIR, written as the rank ends.

* ``functions``: per Python file, the qualified names of the code objects that ran (a trace function called on each
  new frame only: it returns None, so no line is traced), and those dynamo traced without running them (inlined
  into a compiled graph: torch's ``TracingContext.traced_code``, recorded as it is appended to);
* ``files``: those files and every file under the roots the rank opened (an audit hook: assets such as the
  c4 sample); ``listed``: the folders it listed (a file added there changes what it finds);
* ``complete``: False where dynamo compiled but this torch keeps no ``traced_code``: the functions are then a
  floor, and selection treats the cell's files as wholes.

The roots: the folder holding the imported ``torchtitan`` package (its ``torchtitan/`` files only where that is a
site-packages folder) and the checkout the launch names. A fork server starts this before its imports; its ranks
inherit what it saw and write their own file (``AT_EXIT``)."""

import atexit
import importlib.util
import json
import os
import sys
import threading

from .hooks import after_import

SKIP = ("site-packages", "dist-packages", "__pycache__")  # never the checkout's own code
META = (".egg-info", ".dist-info")  # an install's metadata, read by importlib.metadata
_code = {}  # id(code) -> code, for every code object that ran under a root (kept: ids stay unique)
_opened = set()  # rel paths opened
_listed = set()  # rel paths of folders listed (not by the import system: its finders list every package's folder)
_roots = []  # (absolute root + os.sep, only: a rel prefix or "")
_files = {}  # co_filename -> rel path, or None (outside the roots)
_dynamo = {"compiled": False, "traced": False}
_done = []
# who reads files for reasons of its own: the import system's finders and loaders, this shim
_NOT_THE_RANKS = ("<frozen importlib", os.path.dirname(os.path.abspath(__file__)))


def _rel(path):
    path = os.path.abspath(path)
    for root, only in _roots:
        if path.startswith(root):
            rel = path[len(root) :]
            if rel.startswith(only) and not any(
                p.startswith(".") or p in SKIP or p.endswith(META) for p in rel.split(os.sep)
            ):
                return rel.replace(os.sep, "/")
    return None


def _keep(code):
    """Keep ``code`` where its file is under a root (each file placed once)."""
    name = code.co_filename
    rel = _files.get(name, 0)
    if rel == 0:
        rel = _files[name] = _rel(name) if name.endswith(".py") else None
    if rel is not None:
        _code[id(code)] = code


def _trace(frame, event, arg):
    _keep(frame.f_code)
    return None  # no line events: a new frame's call is all it costs


def _audit(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        rel = _rel(os.fsdecode(args[0]))
        if rel is not None and not _ours(sys._getframe(1)):
            (_opened if event == "open" else _listed).add(rel)


def _ours(frame, depth=12):
    """Whether the open or listing comes from the import system (what it imports runs, and is traced) or this shim
    (provenance hashes the tree), os.walk or glob in between."""
    while frame is not None and depth:
        if frame.f_code.co_filename.startswith(_NOT_THE_RANKS):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


class _Traced(list):
    """torch's TracingContext.traced_code: each code dynamo traces (the compiled frame and every function it
    inlined) is also one that ran, for the footprint."""

    def append(self, code):
        _keep(code)
        super().append(code)


def _hook_dynamo(guards):
    init = guards.TracingContext.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _dynamo["compiled"] = True
        if isinstance(getattr(self, "traced_code", None), list):
            self.traced_code = _Traced(self.traced_code)
            _dynamo["traced"] = True

    guards.TracingContext.__init__ = __init__


def start(checkout):
    spec = importlib.util.find_spec("torchtitan")
    if spec is not None and spec.origin:
        parent = os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
        only = "" if os.path.isdir(os.path.join(parent, ".git")) else "torchtitan" + os.sep
        _roots.append((parent + os.sep, only))
    if checkout and checkout != "1" and os.path.isdir(checkout):
        _roots.append((os.path.abspath(checkout) + os.sep, ""))
    if not _roots:
        return
    atexit.register(record)
    sys.settrace(_trace)
    threading.settrace(_trace)
    sys.addaudithook(_audit)
    after_import("torch._guards", "footprint:traced_code")(_hook_dynamo)


def record():
    """This rank's footprint, as ``footprint.rank<R>.json`` (once: the fork server's ranks and atexit both call)."""
    folder = os.environ.get("SIMPLEFSDP_EVIDENCE_DIR")
    if not folder or not _roots or _done:
        return
    _done.append(True)
    sys.settrace(None)
    functions = {}
    for code in list(_code.values()):
        rel = _files.get(code.co_filename)
        if rel is not None:
            functions.setdefault(rel, set()).add(getattr(code, "co_qualname", code.co_name))
    doc = {
        "roots": [r for r, _ in _roots],
        "files": sorted(set(functions) | _opened),
        "listed": sorted(_listed),
        "functions": {f: sorted(q) for f, q in sorted(functions.items())},
        "complete": not (_dynamo["compiled"] and not _dynamo["traced"]),
    }
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"footprint.rank{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump(doc, f)
