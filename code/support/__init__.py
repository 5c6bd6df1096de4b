"""The book's infrastructure, shared by every chapter: argument checks, figure style, data files.

Nothing here is taught; the chapters import it so that their saved code can stay about
attention. One convention holds for bad input across the whole book: a wrong type raises
``TypeError``, a wrong value raises ``ValueError``, and the message names the argument,
says what is allowed and shows what was given, before any work is done.
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
    describe,
)
from .data import data_path
from .style import PALETTE, apply_book_style

__all__ = [
    "PALETTE",
    "apply_book_style",
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
]
