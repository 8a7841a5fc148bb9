"""How the shim's patches reach torchtitan's modules, however they are imported: at once where the module is
already imported, right after its body ran where it is imported later (a finder first on ``sys.meta_path``), and
where another import hook loads it past that finder (a user's site hook, a profiler's loader), at the next import
after it finished (an audit hook: every new module load raises the ``import`` event). A patch that never found
its module stays pending; what attached is recorded per rank, so that a probe that did not run is told apart
from a run that did not do what its label says.

Patches act on classes and module attributes that are looked up when called (``Trainer.train_step``,
``dist_utils.clip_grad_norm_``), never on names other modules copied at their import."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

# a module more than one part of the shim attaches to: torch's context-parallel attention (the CPU patch, effects)
CP_ATTENTION = "torch.distributed.tensor.experimental._context_parallel._attention"
STARTUP_LINES = []  # what the shim said at start-up: a fork server's ranks repeat it into their own logs
PENDING = {}  # module name -> [(label, patch)] not applied yet
ATTACHED = []  # the labels of the patches applied in this process (a forked rank inherits the server's)
_ON_ATTACH = []  # callbacks told each attached label (the probe records them)


def say(line):
    STARTUP_LINES.append(line)
    print(line, file=sys.stderr, flush=True)


def _ready(module) -> bool:
    """A module whose body has run to its end (not one still executing its imports)."""
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def _apply(name, module):
    for label, patch in PENDING.pop(name, []):
        try:
            patch(module)
        except Exception as e:  # a torchtitan the patch does not fit: it did not attach, said; the rank runs on
            say(f"[simplefsdp-shim] {label} did not attach to {name}: {type(e).__name__}: {e}")
            continue
        ATTACHED.append(label)
        for tell in _ON_ATTACH:
            tell(label)


def after_import(module_name, label=None):
    """Decorator: run ``patch(module)`` once ``module_name`` is imported (at once where it is)."""

    def register(patch):
        PENDING.setdefault(module_name, []).append((label or f"{module_name}:{patch.__name__}", patch))
        module = sys.modules.get(module_name)
        if _ready(module):
            _apply(module_name, module)
        else:
            install()
        return patch

    return register


def on_attach(callback):
    """``callback(label)`` for every patch attached from now on."""
    _ON_ATTACH.append(callback)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs registered patches right after a module's body has executed."""

    def find_spec(self, name, path=None, target=None):
        if name not in PENDING:
            return None
        at = sys.meta_path.index(self)
        sys.meta_path.pop(at)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(at, self)  # where it was: a finder put ahead of it (a profiler's) stays ahead
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _apply(name, module)

        spec.loader.exec_module = exec_then_patch
        return spec


def _audit(event, args):
    """The fallback: a pending module that came in past the finder is patched at the next import after it."""
    if event == "import" and PENDING:
        for name in [n for n in PENDING if _ready(sys.modules.get(n))]:
            _apply(name, sys.modules[name])


_INSTALLED = []


def install():
    """The finder first on sys.meta_path, and the audit hook (once per process: audit hooks cannot be removed;
    ``SIMPLEFSDP_PROBE_FALLBACK=0`` leaves it out, to see what a foreign import hook does without it)."""
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())
    if not _INSTALLED and os.environ.get("SIMPLEFSDP_PROBE_FALLBACK") != "0":
        sys.addaudithook(_audit)
        _INSTALLED.append(True)
