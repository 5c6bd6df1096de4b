"""Command line: python -m benchmarks [--quick] [--device cpu|cuda|auto] [--out PATH] [--threads N]."""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch
from longctx.support import measure
from longctx.support.measure import cache_sizes, last_level_cache_bytes
from longctx.support.runs import load_average, machine_record, write_results

from . import decode, memory, prefill, ring, scan
from .ceilings import measure_ceilings
from .common import (
    DEVICE_CHOICES,
    Progress,
    default_results_path,
    resolve_device,
    set_allocator,
)

FULL = {
    "decode_tokens": [1024, 4096, 8192, 16384, 32768, 65536],
    "prefill_tokens": [512, 1024, 2048, 4096, 8192, 16384],
    "scan_tokens": [256, 1024, 4096, 16384],
    "memory_tokens": [1024, 8192, 65536],
    "ring_parts": [1, 2, 4],
    "ring_tokens": 1023,
    "ring_overlap_tokens": 4096,
    "sharded_tokens": 16384,
    "warm_cold": decode.WARM_COLD,
    "allocator_control": decode.ALLOCATOR_CONTROL,
    "min_run_time": 0.2,
}
QUICK = {
    "decode_tokens": [1024, 4096, 16384],
    "prefill_tokens": [512, 1024, 2048],
    "scan_tokens": [256, 1024],
    "memory_tokens": [1024, 4096],
    "ring_parts": [2, 4],
    "ring_tokens": 255,
    "ring_overlap_tokens": 1024,
    "sharded_tokens": 2048,
    "warm_cold": (("gqa8", 1024), ("gqa8", 16384)),
    "allocator_control": (("int8", 4096),),
    "min_run_time": 0.05,
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in under two minutes")
    parser.add_argument("--device", default="cpu", choices=DEVICE_CHOICES, help="where to run (default cpu)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="results file (default benchmarks/results/benchmarks-<device>[-quick|-partial].json)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["ring", "prefill", "scan", "memory", "decode"],
                        help="parts to leave out")
    return parser.parse_args(argv)


def summary_table(results: dict) -> str:
    """Return the plain-text summary printed at the end of a run."""
    lines = [f"machine: {results['machine']['device_name']} ({results['machine']['threads']} threads, "
             f"torch {results['machine']['torch_version']}, {results['machine']['mode']} run)"]
    floor = results["floors"]
    lines.append(f"floor: read {floor['bytes_per_s'] / 1e9:.1f} GB/s, {floor['flop_per_s'] / 1e9:.1f} GFLOP/s"
                 + "".join(f"; {when} {m['bytes_per_s'] / 1e9:.1f} GB/s, {m['flop_per_s'] / 1e9:.1f} GFLOP/s"
                           for when, m in zip(("start", "end"), floor.get("measured", []), strict=False)))
    if results.get("decode"):
        largest = max(r["tokens"] for r in results["decode"])
        reference = decode.time_at(results["decode"], decode.REFERENCE, largest)
        lines.append(f"decode step at T={largest} (cold):")
        lines.append(f"  {'design':20s} {'ms':>9s} {'MiB read':>9s} {'% roofline':>16s} {'x gqa8':>7s}")
        for r in results["decode"]:
            if r["tokens"] == largest:
                share = r["percent_of_roofline"]
                span = r.get("roofline_range") or [share, share]
                ratio = r["seconds"] / reference["seconds"] if reference else float("nan")
                lines.append(f"  {r['design']:20s} {r['seconds'] * 1e3:9.2f} {r['cache_bytes'] / 2**20:9.1f} "
                             + (f"{share:6.1f} ({span[0]:.0f}-{span[1]:.0f})" if share is not None
                                else f"{'':16s}") + f" {ratio:7.2f}")
    for line in results.get("targets", []):
        verdict = "met" if line["met"] else "MISSED"
        lines.append(f"target {line['target']:8s} {line['design']:16s} T={line['tokens']}: "
                     f"{line['value']:.2f} (goal {line['goal']}) {verdict}")
    if results.get("prefill"):
        for slow, fast_design in (("full-sdpa", "window-banded"), ("full-sdpa", "window-blocksparse"),
                                  ("full-sdpa", "linear-chunked")):
            n = prefill.crossovers(results["prefill"], slow, fast_design)
            lines.append(f"prefill: {fast_design} beats {slow} from n = {n if n else 'never (in range)'}")
    if results.get("scan"):
        for r in results["scan"]["scan"]:
            lines.append(f"scan T={r['tokens']}: parallel is {r['speedup']:.1f}x the loop's speed")
    if results.get("ring"):
        for r in results["ring"]["runs"]:
            lines.append(f"ring P={r['parts']}: max diff {r['max_abs_diff']:.1e}, "
                         f"cache per rank {r['cache_bytes_per_rank']}")
        lines.append(f"gloo link {results['ring']['link_bytes_per_s'] / 1e9:.2f} GB/s")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.threads is not None:
        if args.threads < 1:
            print(f"error: --threads must be >= 1 (got {args.threads})", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    sizes = QUICK if args.quick else FULL
    progress = Progress()
    started = time.monotonic()
    # A run that leaves parts out is "partial": support.load_results("benchmarks") prefers a full one.
    mode = "partial" if args.skip else "quick" if args.quick else "full"
    results = {"machine": machine_record(device, threads, mode), "sizes": sizes}
    results["machine"]["llc_bytes"] = last_level_cache_bytes() if device.type == "cpu" else None
    results["machine"]["l2_bytes"] = cache_sizes().get(2) if device.type == "cpu" else None
    progress(f"benchmarks on {results['machine']['device_name']} ({device.type}), {threads} threads, "
             f"{results['machine']['mode']} run")
    results["floors"] = measure.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["ceilings"] = measure_ceilings(device=device, threads=threads, quick=args.quick, progress=progress)
    mrt = sizes["min_run_time"]
    if "decode" not in args.skip and device.type == "cpu":  # the allocator's lesson first (glibc's, the CPU's)
        results["allocator"] = decode.run_allocator_control(sizes["allocator_control"], device=device,
                                                            threads=threads, progress=progress,
                                                            min_run_time=mrt)
    results["machine"]["allocator"] = set_allocator(True, heap_only=True)
    if "decode" not in args.skip:
        results["warm_cold"] = decode.run_warm_cold(sizes["warm_cold"], device=device, threads=threads,
                                                    progress=progress, min_run_time=mrt)
        results["decode"] = decode.run_decode(sizes["decode_tokens"], device=device, threads=threads,
                                              progress=progress, min_run_time=mrt)
    if "prefill" not in args.skip:
        results["prefill"] = prefill.run_prefill(sizes["prefill_tokens"], device=device, threads=threads,
                                                 progress=progress, min_run_time=mrt)
    if "scan" not in args.skip:
        results["scan"] = scan.run_scan(sizes["scan_tokens"], device=device, threads=threads, progress=progress,
                                        min_run_time=mrt)
    if "memory" not in args.skip:
        results["memory"] = memory.run_memory(sizes["memory_tokens"], device=device, progress=progress)
    if "ring" not in args.skip:
        results["ring"] = ring.run_ring(sizes["ring_parts"], sizes["ring_tokens"], progress=progress,
                                        overlap_tokens=sizes["ring_overlap_tokens"],
                                        sharded_tokens=sizes["sharded_tokens"])
    final = measure.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["floors"] = measure.best_floors(results["floors"], final)
    if results.get("decode"):
        for record in results["decode"]:  # shares of the floor and the roofline, against the better floors
            decode.add_roofline(record, results["floors"], results["ceilings"]["rates"])
        measured = sorted({r["tokens"] for r in results["decode"]})
        targets = [t for t in decode.TARGET_TOKENS if t in measured] or measured[-1:]
        results["targets"] = decode.target_report(results["decode"], targets)
        missed = sorted({line["design"] for line in results["targets"] if not line["met"]})
        results["profiles"] = []
        for design in missed:  # where the time goes, at the longest length measured
            results["profiles"].append(decode.profile_step(design, max(targets), device=device, threads=threads))
            progress(f"profiled {design} at T={max(targets)}")
    results["machine"]["wall_seconds"] = time.monotonic() - started
    results["machine"]["load_average_end"] = load_average()
    out = args.out or default_results_path(device, mode)
    write_results(results, out)
    print(summary_table(results), flush=True)
    print(f"wrote {out} ({results['machine']['wall_seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
