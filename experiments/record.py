"""What a saved run records of the machine it ran on, shared by the experiments' command lines."""

from __future__ import annotations

import os
import platform
import resource
import time
from collections.abc import Callable


def timed_run(machine: dict, run: Callable[[], dict]) -> dict:
    """Return ``run()``'s results, having added to ``machine`` how the run went.

    The machine may be shared, so it records the host, the load average before and after
    (1, 5 and 15 minutes), the wall time, the CPU time of this process and its reaped workers,
    and that CPU time spread over ``machine["processes"]`` (at most the logical CPUs): what
    the wall time would be on an idle machine.
    """
    machine["host"] = platform.node()
    machine["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    wall = time.perf_counter()
    results = run()
    machine["wall_seconds"] = time.perf_counter() - wall
    machine["cpu_seconds"] = sum(usage.ru_utime + usage.ru_stime for usage in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))
    machine["idle_wall_estimate_seconds"] = machine["cpu_seconds"] / max(
        1, min(machine["processes"], os.cpu_count() or 1))
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return results
