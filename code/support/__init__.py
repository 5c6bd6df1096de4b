"""The book's infrastructure, shared by every chapter: argument checks, figure style, data files, saved runs.

Nothing here is taught; the chapters import it so that their saved code can stay about
attention. The checks are for the boundaries, where an argument enters from a person (a
config, a constructor, a reader, a driver): a wrong type raises ``TypeError``, a wrong
value raises ``ValueError``, and the message names the argument, says what is allowed and
shows what was given, before any work is done. One helper per kind of check.
``runs`` holds the one timer (``time_call``), the record of a run (``machine_record``,
``timed_run``, ``write_results``) and the one loader of saved runs (``load_results``), which
finds them in the installed package from any folder. ``measure`` holds the machine's caches
and floors, the cold copies a timed step reads and the interleaved rounds that compare two
steps, with their intervals: the benchmarks and the experiments share them.
"""

from .checks import (
    check_attention_inputs,
    check_bits,
    check_bool,
    check_choice,
    check_device,
    check_divides,
    check_dtype,
    check_int,
    check_int_sequence,
    check_number,
    check_tensor,
    check_type,
    config_value,
    describe,
)
from .data import data_path
from .runs import load_results, machine_record, results_folders, time_call, timed_run, write_results
from .style import DESIGN_COLOURS, PALETTE, apply_book_style

__all__ = [
    "DESIGN_COLOURS",
    "PALETTE",
    "apply_book_style",
    "load_results",
    "machine_record",
    "results_folders",
    "time_call",
    "timed_run",
    "write_results",
    "check_attention_inputs",
    "check_bits",
    "check_bool",
    "check_choice",
    "check_device",
    "check_divides",
    "check_dtype",
    "check_int",
    "check_int_sequence",
    "check_number",
    "check_tensor",
    "check_type",
    "data_path",
    "describe",
    "config_value",
]
