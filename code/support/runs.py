"""Measured runs: the one timer, the record of the machine, and saved runs written and read.

Chapter 2 and Chapter 10 time a call with ``time_call``, and so does every benchmark. A
saved run (``python -m benchmarks``, ``python -m experiments ...``) is a JSON file headed
by ``machine_record``, timed by ``timed_run`` and written by ``write_results``; the
chapters read it back with ``load_results``. The saved runs the chapters read are
shipped in the package (``longctx.experiment_results`` is the repository's
``experiments/results``, ``longctx.benchmark_results`` its ``benchmarks/results``), so
they load from any folder, in the repository or far from it.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import pathlib
import platform
import re
import resource
import time
from collections.abc import Callable

import torch
import torch.utils.benchmark as torch_benchmark

from .checks import check_int, check_number, check_type

# The packages that hold the saved runs, as pyproject.toml maps them onto the repository's folders.
RESULT_PACKAGES = ("longctx.experiment_results", "longctx.benchmark_results")


def time_call(function: Callable[[], object], *, threads: int = 1, min_run_time: float = 0.2,
              slow_repeats: int = 5, min_blocks: int = 5) -> dict:
    """Return how long one call of ``function`` takes: a median over blocks of calls, after a warm-up.

    The first call is a warm-up (it pays for page faults, the choice of kernel and the
    allocator's growth) and is timed on its own. ``torch.utils.benchmark.Timer``, on
    ``threads`` threads, then picks how many calls make a block long enough to time,
    repeats blocks for at least ``min_run_time`` seconds and reports the median block
    time per call. A call slower than ``min_run_time`` would give a single block, so it
    is instead timed ``slow_repeats`` times, one call a block; any other measurement of
    fewer than ``min_blocks`` blocks is topped up with blocks of the same size. On CUDA
    the Timer synchronises.

    Args:
        function: What to time, called with no arguments.
        threads: The torch threads the calls run on.
        min_run_time: The least seconds the blocks take together.
        slow_repeats: How often a slow call is timed.
        min_blocks: The fewest blocks a median rests on.

    Returns:
        ``{"seconds": median per call, "runs": blocks, "iqr_seconds": interquartile
        range, "warmup_seconds": the first call}``.

    Raises:
        TypeError: If ``function`` is not callable or a setting has the wrong type.
        ValueError: If a count is below 1 or ``min_run_time`` is not above 0.
    """
    check_type("function", function, Callable)
    threads = check_int("threads", threads, minimum=1)
    min_run_time = check_number("min_run_time", min_run_time, above=0)
    slow_repeats = check_int("slow_repeats", slow_repeats, minimum=1)
    min_blocks = check_int("min_blocks", min_blocks, minimum=1)
    started = time.perf_counter()
    function()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    warm_up = time.perf_counter() - started
    timer = torch_benchmark.Timer(stmt="function()", globals={"function": function},
                                  num_threads=threads)
    if warm_up > min_run_time:
        blocks = [timer.timeit(1) for _ in range(slow_repeats)]
    else:
        first = timer.blocked_autorange(min_run_time=min_run_time)
        blocks = [first] + [timer.timeit(first.number_per_run)
                            for _ in range(min_blocks - len(first.times))]
    measurement = torch_benchmark.Measurement.merge(blocks)[0]
    return {"seconds": float(measurement.median), "runs": len(measurement.times),
            "iqr_seconds": float(measurement.iqr), "warmup_seconds": warm_up}


def cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo (or platform.processor() where that is unreadable)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def device_label(device: torch.device) -> str:
    """Return a human name for the device: the CPU model or the GPU name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def device_slug(device: torch.device) -> str:
    """Return the file-name form of the device, e.g. 'cpu-amd-epyc' or 'cuda-nvidia-h200'."""
    words = re.sub(r"\(r\)|\(tm\)|cpu|@.*$", " ", device_label(device).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", words).strip("-")
    return f"{device.type}-{slug or 'unknown'}"


def load_average() -> float | None:
    """Return the system's one-minute load average (runnable processes), or None where unavailable."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


#: The /proc/cpuinfo flags that decide which kernels run: vector width, int8 and bf16 dot products, AMX.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def isa_flags(cpuinfo: str | None = None) -> list[str] | None:
    """Return which of ``ISA_FLAGS`` the CPU reports (from /proc/cpuinfo's first flags line), or None."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in ISA_FLAGS if flag in present]
    return None


def cpu_signature(cpuinfo: str | None = None) -> str | None:
    """Return the first CPU's family, model and stepping from /proc/cpuinfo, or None.

    Two machines can report the same model name (a VM often shows "AMD EPYC" for any of its
    generations); their signatures tell them apart, as "family 26 model 2 stepping 1".
    """
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block ends
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    parts = [(name, fields.get(key)) for name, key in (("family", "cpu family"), ("model", "model"),
                                                        ("stepping", "stepping"))]
    if any(value is None or not value.isdigit() for _, value in parts):
        return None
    return " ".join(f"{name} {value}" for name, value in parts)


def math_libraries() -> dict[str, str | None]:
    """Return the MKL and oneDNN versions this torch was built with (from torch.__config__.show())."""
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    onednn = re.search(r"MKL-DNN v([\w.]+)", config)
    return {"mkl": mkl.group(1) if mkl else None, "onednn": onednn.group(1) if onednn else None}


def transparent_hugepages() -> str | None:
    """Return the kernel's transparent-huge-page mode (the bracketed word), or None where unreadable."""
    try:
        text = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen else None


def cpu_seconds_by_kind(stat: str | None = None) -> dict[str, float] | None:
    """Return the machine's busy and stolen CPU seconds since boot, from /proc/stat's ``cpu`` line.

    Busy is user + nice + system + irq + softirq, all processes together; steal is time a
    hypervisor gave this VM's CPUs to another guest. None where /proc/stat is unreadable.
    """
    if stat is None:
        try:
            stat = pathlib.Path("/proc/stat").read_text()
        except OSError:
            return None
    fields = stat.splitlines()[0].split()
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    return {"busy": (user + nice + system + irq + softirq) / tick, "steal": steal / tick}


def machine_record(device: torch.device, threads: int, mode: str) -> dict:
    """Return the description of the run that every results file begins with.

    ``mode`` names the run's size (``full``, ``quick``, ``tiny``...); ``load_results``
    prefers a ``full`` run.
    """
    return {
        "device": device.type,
        "device_name": device_label(device),
        "device_slug": device_slug(device),
        "cpu_model": cpu_model(),
        "cpu_signature": cpu_signature(),
        "threads": threads,
        "logical_cpus": os.cpu_count(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": mode,
        "load_average_start": load_average(),
        "isa_flags": isa_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "math_libraries": math_libraries(),
        "transparent_hugepages": transparent_hugepages(),
    }


def _own_cpu_seconds() -> float:
    """Return the CPU seconds this process and its reaped workers have used so far."""
    return sum(usage.ru_utime + usage.ru_stime for usage in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def timed_run(machine: dict, run: Callable[[], dict]) -> dict:
    """Return ``run()``'s results, having added to ``machine`` how the run went.

    The machine may be shared, so it records the host, the load average before and after
    (1, 5 and 15 minutes; it counts the run's own threads too), the wall time, the CPU time of
    this process and its reaped workers, and that CPU time spread over ``machine["processes"]``
    (at most the logical CPUs): what the wall time would be on an idle machine. From
    /proc/stat it adds what the load average cannot tell apart: the CPU seconds other
    processes used during the run, and the seconds a hypervisor stole.
    """
    machine["host"] = platform.node()
    machine["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    before, own_before = cpu_seconds_by_kind(), _own_cpu_seconds()
    wall = time.perf_counter()
    results = run()
    machine["wall_seconds"] = time.perf_counter() - wall
    machine["cpu_seconds"] = _own_cpu_seconds() - own_before  # the run's, not the imports' before it
    machine["idle_wall_estimate_seconds"] = machine["cpu_seconds"] / max(
        1, min(machine["processes"], os.cpu_count() or 1))
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    after = cpu_seconds_by_kind()
    if before is not None and after is not None:
        machine["steal_seconds"] = round(after["steal"] - before["steal"], 2)
        others = after["busy"] - before["busy"] - machine["cpu_seconds"]
        machine["other_processes_cpu_seconds"] = round(max(0.0, others), 2)
    return results


def write_results(results: dict, path: pathlib.Path) -> None:
    """Write ``results`` as indented JSON, atomically (a .tmp file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def results_folders() -> list[pathlib.Path]:
    """Return the folders that really hold the saved runs, as the installed package finds them.

    From a wheel they are ``longctx/experiment_results`` and ``longctx/benchmark_results``
    inside ``site-packages``. In setuptools' strict editable install (``make env``) they are
    trees of links, which are followed back to the repository's ``experiments/results`` and
    ``benchmarks/results``, so a run saved there is found without reinstalling. In the
    default editable install they are those folders themselves.
    """
    found = []
    for package in RESULT_PACKAGES:
        spec = importlib.util.find_spec(package)
        for folder in [] if spec is None else spec.submodule_search_locations or []:
            runs = sorted(pathlib.Path(folder).glob("*.json")) if pathlib.Path(folder).is_dir() else []
            if runs:
                found.append(runs[0].resolve().parent)
                break
    return found


def load_results(prefix: str, folder: str | pathlib.Path | None = None) -> tuple[dict, pathlib.Path]:
    """Return the newest saved run named ``<prefix>-*.json`` and its path.

    ``prefix`` is ``"copying"``, ``"extension"``, ``"forgetting"`` or ``"speculative"`` for the
    experiments of Chapter 6, 6, 7 and 8, ``"benchmarks"`` for Chapter 10's measurements,
    ``"ceilings"`` for its study of a machine's ceilings and ``"serving"`` for Chapter 13's. Of the files whose
    machine record says ``mode: full`` it takes the newest by the record's date, else the
    newest of any mode.

    Args:
        prefix: The start of the file names.
        folder: Where to look; by default the saved runs the package ships (``results_folders``),
            which from the repository are its ``experiments/results`` and ``benchmarks/results``.

    Raises:
        TypeError: If ``prefix`` is not a string or ``folder`` not a string or a path.
        ValueError: If ``prefix`` is empty or ``folder`` is not an existing folder.
        FileNotFoundError: If there is no such file (the message names the folders looked in).
    """
    check_type("prefix", prefix, str)
    if not prefix:
        raise ValueError("prefix must be a non-empty file-name prefix (got '')")
    if folder is None:
        folders = results_folders()
    else:
        check_type("folder", folder, (str, pathlib.Path))
        folders = [pathlib.Path(folder)]
        if not folders[0].is_dir():
            raise ValueError(f"folder must be an existing folder (got {str(folder)!r})")
    runs = [(json.loads(path.read_text(encoding="utf-8")), path)
            for where in folders for path in sorted(where.glob(f"{prefix}-*.json"))]
    if not runs:
        looked = ", ".join(str(where) for where in folders) or f"the packages {', '.join(RESULT_PACKAGES)}"
        raise FileNotFoundError(
            f"no {prefix}-*.json in {looked}; pass folder= a folder that holds one, "
            "or save a run (`make experiment`, `make bench`)")
    full = [run for run in runs if run[0]["machine"]["mode"] == "full"]
    return max(full or runs, key=lambda run: run[0]["machine"]["date"])
