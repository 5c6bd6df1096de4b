"""longctx.support.runs: the one timer, the record of a run, and saved runs written and read from anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from longctx import support
from longctx.support import runs

ROOT = Path(__file__).resolve().parent.parent
# What each chapter reads: the prefix and the repository folder its runs are saved in.
SAVED_RUNS = {"copying": "experiments/results", "extension": "experiments/results",
              "forgetting": "experiments/results", "benchmarks": "benchmarks/results"}


# --------------------------------------------------------------------------- the timer


def test_time_call_warms_up_once_then_times_at_least_min_blocks_blocks():
    calls = []
    timing = support.time_call(lambda: calls.append(1), min_run_time=0.01, min_blocks=7)
    assert set(timing) == {"seconds", "runs", "iqr_seconds", "warmup_seconds"}
    assert timing["runs"] >= 7
    assert len(calls) > timing["runs"]  # the warm-up, then at least one call a block


def test_time_call_times_a_slow_call_slow_repeats_times_one_call_a_block():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    timing = support.time_call(slow, min_run_time=0.01, slow_repeats=3)
    assert timing["runs"] == 3 and len(calls) >= 1 + 3  # the warm-up, then a block of one call, thrice
    assert timing["seconds"] >= 0.02 and timing["warmup_seconds"] >= 0.02


def test_time_call_runs_on_the_threads_asked_and_gives_the_process_its_own_back():
    before = torch.get_num_threads()
    seen = []
    support.time_call(lambda: seen.append(torch.get_num_threads()), threads=1, min_run_time=0.01)
    assert set(seen[1:]) == {1}  # every timed call; the warm-up runs as the caller left it
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(function=3), TypeError, "function"),
    (dict(threads=0), ValueError, "threads"),
    (dict(threads=1.0), TypeError, "threads"),
    (dict(min_run_time=0), ValueError, "min_run_time"),
    (dict(min_run_time="1"), TypeError, "min_run_time"),
    (dict(slow_repeats=0), ValueError, "slow_repeats"),
    (dict(min_blocks=True), TypeError, "min_blocks"),
])
def test_time_call_refuses_bad_settings_by_name(arguments, error, message):
    arguments = {"function": lambda: None, **arguments}
    with pytest.raises(error, match=message):
        support.time_call(arguments.pop("function"), **arguments)


# --------------------------------------------------------------------------- the record of a run


def test_timed_run_records_how_the_run_went(tmp_path):
    machine = support.machine_record(torch.device("cpu"), 1, "tiny")
    assert machine["mode"] == "tiny" and machine["device_slug"].startswith("cpu-")
    assert machine["date"].endswith("Z") and machine["threads"] == 1
    machine["processes"] = 1
    results = support.timed_run(machine, lambda: {"answer": sum(range(10**6))})
    assert results == {"answer": 499999500000}
    assert machine["wall_seconds"] <= machine["cpu_seconds"] + 1  # one process, no waiting
    # the run's CPU time, not the process's since it started (its imports took seconds)
    assert machine["cpu_seconds"] <= machine["wall_seconds"] * os.cpu_count() + 0.05
    assert machine["idle_wall_estimate_seconds"] == machine["cpu_seconds"]
    assert len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3
    out = tmp_path / "deep" / "study-cpu.json"
    support.write_results({"machine": machine, **results}, out)
    assert json.loads(out.read_text())["answer"] == 499999500000
    assert sorted(p.name for p in out.parent.iterdir()) == ["study-cpu.json"]  # no .tmp left


def test_the_record_names_the_kernels_this_cpu_can_run():
    machine = support.machine_record(torch.device("cpu"), 1, "tiny")
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(machine["math_libraries"]) == {"mkl", "onednn"}
    flags = machine["isa_flags"]
    assert flags is None or set(flags) <= set(runs.ISA_FLAGS)
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni amx_tile\nflags : avx\n"
    assert runs.isa_flags(cpuinfo) == ["avx2", "fma", "avx512f", "avx512_vnni", "amx_tile"]
    assert runs.isa_flags("processor : 0\n") is None


def test_the_record_tells_apart_two_cpus_of_one_name_by_their_signature():
    machine = support.machine_record(torch.device("cpu"), 1, "tiny")
    assert machine["cpu_signature"] is None or machine["cpu_signature"].startswith("family ")
    zen5 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
            "model name\t: AMD EPYC\nstepping\t: 1\n\nprocessor\t: 1\ncpu family\t: 25\n")
    assert runs.cpu_signature(zen5) == "family 26 model 2 stepping 1"  # the first processor's, not the second's
    assert runs.cpu_signature(zen5.replace("stepping\t: 1", "stepping\t: unknown")) is None
    assert runs.cpu_signature("processor : 0\nmodel name : Apple M2\n") is None  # no family: not x86


def test_proc_stat_is_read_as_busy_and_stolen_seconds():
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    line = f"cpu  {3 * tick} {tick} {2 * tick} 9999 7 {tick} {tick} {5 * tick} 0 0\ncpu0 1 2 3\n"
    assert runs.cpu_seconds_by_kind(line) == {"busy": 8.0, "steal": 5.0}
    assert runs.cpu_seconds_by_kind("intr 1 2 3\n") is None


def test_timed_run_counts_other_processes_apart_from_its_own_cpu(monkeypatch):
    stats = iter([{"busy": 100.0, "steal": 4.0}, {"busy": 110.0, "steal": 4.5}])
    own = iter([1.0, 3.0])  # this process used 2 s of the machine's 10 busy seconds
    monkeypatch.setattr(runs, "cpu_seconds_by_kind", lambda: next(stats))
    monkeypatch.setattr(runs, "_own_cpu_seconds", lambda: next(own))
    machine = {"processes": 1}
    assert support.timed_run(machine, lambda: {"answer": 42}) == {"answer": 42}
    assert machine["cpu_seconds"] == 2.0  # the run's own: not the 1 s the process used before it
    assert machine["other_processes_cpu_seconds"] == 8.0 and machine["steal_seconds"] == 0.5


# --------------------------------------------------------------------------- the one loader


def _saved_run(folder, name, mode, date):
    machine = {"mode": mode, "date": date}
    (folder / name).write_text(json.dumps({"machine": machine, "name": name}), encoding="utf-8")


def test_load_results_takes_the_newest_full_run_of_its_prefix(tmp_path):
    _saved_run(tmp_path, "runs-a.json", "full", "2026-01-02T00:00:00Z")
    _saved_run(tmp_path, "runs-b.json", "full", "2026-03-01T00:00:00Z")
    _saved_run(tmp_path, "runs-c-tiny.json", "tiny", "2026-05-01T00:00:00Z")
    _saved_run(tmp_path, "other-d.json", "full", "2026-06-01T00:00:00Z")
    results, path = support.load_results("runs", tmp_path)
    assert path == tmp_path / "runs-b.json" and results["name"] == "runs-b.json"
    assert support.load_results("runs", str(tmp_path))[1] == path  # a string names the folder too
    (tmp_path / "runs-a.json").unlink()
    (tmp_path / "runs-b.json").unlink()
    assert support.load_results("runs", tmp_path)[1].name == "runs-c-tiny.json"  # no full run


def test_load_results_says_where_it_looked_and_refuses_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no runs-\\*.json in {tmp_path}; pass folder="):
        support.load_results("runs", tmp_path)
    with pytest.raises(FileNotFoundError, match="no nothing-\\*.json in .*experiments/results, .*benchmarks/results"):
        support.load_results("nothing")
    with pytest.raises(ValueError, match="folder must be an existing folder"):
        support.load_results("runs", tmp_path / "missing")
    with pytest.raises(TypeError, match="folder must be a str or Path"):
        support.load_results("runs", 3)
    with pytest.raises(ValueError, match="prefix"):
        support.load_results("", tmp_path)


def test_the_package_finds_the_saved_runs_in_the_repository():
    """make env's editable install ships experiments/results and benchmarks/results as links, which
    results_folders follows back to the repository, so a run saved there is read without reinstalling."""
    assert support.results_folders() == [ROOT / "experiments" / "results", ROOT / "benchmarks" / "results"]
    for prefix, folder in SAVED_RUNS.items():
        run, path = support.load_results(prefix)
        assert path.parent == ROOT / folder and run["machine"]["mode"] == "full", prefix


@pytest.mark.slow  # starts another Python process
def test_every_saved_run_loads_outside_the_repository(tmp_path):
    """A reader's folder far from the repository: each run the chapters read loads, and it is the
    repository's file; Chapter 10's floors and decode times (Exercises 10.1 and 5.2) among them."""
    script = textwrap.dedent(
        f"""
        import json
        from longctx import support
        found = {{}}
        for prefix in {sorted(SAVED_RUNS)!r}:
            run, path = support.load_results(prefix)
            found[prefix] = {{"path": str(path), "run": run}}
        print(json.dumps(found))
        """
    )
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    for prefix, folder in SAVED_RUNS.items():
        path = Path(found[prefix]["path"])
        assert path.parent == ROOT / folder, prefix
        assert found[prefix]["run"] == json.loads(path.read_text(encoding="utf-8")), prefix
    bench = found["benchmarks"]["run"]
    assert bench["floors"]["bytes_per_s"] > 0 and bench["floors"]["flop_per_s"] > 0
    assert {"mqa", "gqa8", "gqa8-materialised"} <= {row["design"] for row in bench["decode"]}


# --------------------------------------------------------------------------- the studies' one command line


def test_every_study_gives_the_shared_command_line_its_sizes_and_job_count():
    """python -m experiments {copying,extension,forgetting,speculative}: one main() reads each study's SIZES and
    job_count (how many processes a run can keep busy) and runs its run_experiment."""
    import importlib

    from experiments.__main__ import STUDIES, parse_args

    counts = {}
    for name in STUDIES:
        study = importlib.import_module(f"experiments.{name}")
        assert sorted(study.SIZES) == ["full", "tiny"] and callable(study.run_experiment), name
        counts[name] = (study.job_count(study.SIZES["tiny"]), study.job_count(study.SIZES["full"]))
    # copying: seeds x 3 mixers; extension: a seed each on the matched base, and the other base's; forgetting: seeds;
    # speculative: a seed each, and the verification timing
    assert counts == {"copying": (6, 15), "extension": (3, 7), "forgetting": (2, 5), "speculative": (2, 3)}
    args = parse_args(["forgetting", "--jobs", "3", "--seeds", "4", "5"])
    assert (args.study, args.size, args.jobs, args.seeds, args.out) == ("forgetting", "full", 3, [4, 5], None)


def test_the_experiments_measure_with_the_books_helpers_not_the_benchmarks():
    """A study times and records its run through longctx.support (runs, measure), so that the experiments
    run without the benchmarks folder: no study imports from it."""
    import ast

    imported = {}
    for path in sorted((ROOT / "experiments").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported[path.name] = {node.module.split(".")[0] for node in ast.walk(tree)
                               if isinstance(node, ast.ImportFrom) and node.module} | {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names}
    assert "speculative.py" in imported and "longctx" in imported["speculative.py"]
    assert {name for name, modules in imported.items() if "benchmarks" in modules} == set()
