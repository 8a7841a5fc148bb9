"""The rank side of the plugin: what runs inside every launched rank, loaded by the start-up shim
(fixtures/cpu_shim/sitecustomize.py) before the target imports anything. It imports nothing heavy at its top
(torch is imported inside the patches and probes, once the target has it).

* hooks.py — how patches reach torchtitan's modules however they are imported, and what attached;
* patches.py — the CPU patches per torchtitan generation;
* probes.py — the evidence probe, the per-step invariants and the gradient probe;
* gradmath.py — norms and bit checksums over sharded tensors;
* mutants.py — the mutation tier's bugs, by the moment they act at;
* record.py — the rank's probe records;
* options.py — the option table of the installed torchtitan (run as a subprocess);
* start.py — what the shim starts, from the environment.
"""
