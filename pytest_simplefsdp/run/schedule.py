"""Launch scheduling: run upcoming cells ahead of pytest while resources allow (--simplefsdp-jobs).

pytest runs items one after another; with packing, when an item starts, the cells that follow it
are started too, in item order, as long as they fit: on GPU hosts each cell gets its own disjoint
``CUDA_VISIBLE_DEVICES`` subset, on CPU the ranks of all running cells stay within a budget of
cores. A cell waits at the head of the line rather than being overtaken, and a cell larger than
the whole budget runs alone. Results are still judged and reported in item order by pytest.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout


def fits(world, running, jobs, used, budget, free_devices, devices):
    """Whether a cell of ``world`` ranks may start now: at most ``jobs`` cells; on GPU hosts enough free GPUs,
    on CPU the ranks budget (a cell larger than the whole budget runs alone)."""
    if running >= jobs:
        return False
    if devices:
        return len(free_devices) >= world
    return running == 0 or used + world <= budget


def plan(cells, jobs, budget, devices=None):
    """The packing the Packer does, simulated: ``cells`` [(key, world, seconds)] in item order ->
    [(key, world, start, end, devices)] (devices None on CPU; start None: more GPUs than there are)."""
    devices = list(devices or [])
    free, running, used, now, out = list(devices), [], 0, 0.0, []  # running: (end, world, devices)
    for key, world, seconds in cells:
        if devices and world > len(devices):
            out.append((key, world, None, None, None))  # cannot run on this many GPUs
            continue
        while not fits(world, len(running), jobs, used, budget, free, devices):
            running.sort(key=lambda r: r[0])
            end, w, d = running.pop(0)  # the next cell to end frees its ranks and GPUs
            now, used = max(now, end), used - w
            free = sorted(free + (d or []), key=devices.index)
        got = None
        if devices:
            got, free = free[:world], free[world:]
        used += world
        running.append((now + seconds, world, got))
        out.append((key, world, now, now + seconds, got))
    return out


class Packer:
    def __init__(self, jobs: int, budget: int, devices: list | None = None):
        """``jobs``: cells at once; ``budget``: ranks at once (CPU); ``devices``: GPU ids to hand out."""
        self.jobs, self.budget, self.devices = jobs, budget, list(devices or [])
        self.free_devices = list(self.devices)
        self.used = 0
        self.running = 0
        self.queue = []  # (key, world, work) in item order, not yet started
        self.futures = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="simplefsdp-cell")

    def add(self, key, world, work):
        """``work(devices)`` runs one cell and returns its result; ``devices`` is None on CPU."""
        self.queue.append((key, world, work))

    def _fits(self, world):
        return fits(world, self.running, self.jobs, self.used, self.budget, self.free_devices, self.devices)

    def pump(self):
        with self.lock:
            while self.queue and self._fits(self.queue[0][1]):
                key, world, work = self.queue.pop(0)
                devices = None
                if self.devices:
                    devices, self.free_devices = self.free_devices[:world], self.free_devices[world:]
                self.used += world
                self.running += 1
                future = self.pool.submit(work, devices)
                future.add_done_callback(lambda f, w=world, d=devices: self._release(w, d))
                self.futures[key] = future

    def _release(self, world, devices):
        with self.lock:
            self.used -= world
            self.running -= 1
            if devices:
                self.free_devices = sorted(self.free_devices + devices, key=self.devices.index)

    def result(self, key):
        """The cell's result, starting whatever fits while waiting for it."""
        while True:
            self.pump()
            future = self.futures.get(key)
            if future is None:  # cells ahead of it in the line still hold the resources
                time.sleep(0.05)
                continue
            try:
                value = future.result(timeout=0.2)
            except FutureTimeout:
                continue
            del self.futures[key]
            return value

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
