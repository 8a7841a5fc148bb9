"""The shim's start in a rank (called by fixtures/cpu_shim/sitecustomize.py when the launch asks for it): the
generation's CPU patches (``SIMPLEFSDP_CPU_SHIM``), the probe (``SIMPLEFSDP_PROBE=titan03`` or ``titan02``: the
generation whose trainer it watches), the gradient probe (``SIMPLEFSDP_GRAD_PROBE=1``), the per-step invariants
(``SIMPLEFSDP_INVARIANTS=1``), a mutant (``SIMPLEFSDP_MUTANT``) and the options set on the job config in Python
(``SIMPLEFSDP_CONFIG_SET``, on any device). Applied patches are printed to stderr as ``[simplefsdp-shim] applied:
...`` and end up in every rank's log (under the fork launcher the server prints them once and every forked rank
repeats them)."""

import os

from . import effects, options, patches, probes
from .hooks import install, say


def apply_patches(generation):
    if generation not in patches.PATCH_SETS:
        raise SystemExit(f"SIMPLEFSDP_CPU_SHIM={generation!r}: known patch sets: {', '.join(patches.PATCH_SETS)}")
    chosen = patches.PATCH_SETS[generation]
    skip = {s.strip() for s in os.environ.get("SIMPLEFSDP_CPU_SHIM_SKIP", "").split(",") if s.strip()}
    unknown = skip - set(chosen)
    if unknown:
        raise SystemExit(f"SIMPLEFSDP_CPU_SHIM_SKIP names unknown patches {sorted(unknown)}; known: {sorted(chosen)}")
    install()
    applied = []
    for name, patch in chosen.items():
        if name not in skip:
            patch()
            applied.append(name)
    say(f"[simplefsdp-shim] applied: {','.join(applied)}; skipped: {','.join(sorted(skip)) or '-'}")


def start(env=os.environ):
    if env.get(options.SET_ENV):
        options.config_set()
    if env.get("SIMPLEFSDP_CPU_SHIM"):
        apply_patches(env["SIMPLEFSDP_CPU_SHIM"])
    generation = env.get("SIMPLEFSDP_PROBE")
    if generation:
        if generation not in probes.TRAINERS:
            raise SystemExit(f"SIMPLEFSDP_PROBE={generation!r}: the probe knows {', '.join(probes.TRAINERS)}")
        install()
        probes.evidence()
        effects.effects()
        mutant = env.get("SIMPLEFSDP_MUTANT") or None
        grads, invariants = env.get("SIMPLEFSDP_GRAD_PROBE") == "1", env.get("SIMPLEFSDP_INVARIANTS") == "1"
        probes.training(grads, invariants, mutant, generation)
        if mutant:
            say(f"[simplefsdp-shim] mutant: {mutant}")


def after_fork():
    """In a rank forked by the fork server, once its environment is its own: the probe says it runs here."""
    if os.environ.get("SIMPLEFSDP_PROBE"):
        probes.started()
