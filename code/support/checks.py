"""Argument checks: TypeError for a wrong type, ValueError for a wrong value.

Every check takes the argument's name first, so the message can say which argument was
wrong (``kv_heads must be a positive integer (got 0)``), and returns the value in its
canonical form (a Python ``int`` for any integer type, a ``float`` for any real number),
so a caller writes ``heads = check_int("heads", heads, minimum=1)`` and moves on.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Collection

import torch
from torch import Tensor


def describe(value: object) -> str:
    """Return a short description of ``value`` for an error message.

    A tensor is described by its dtype and shape, a number or string by its
    type and value, anything else by its type name.
    """
    if isinstance(value, Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    if isinstance(value, bool | numbers.Number | str):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """Return ``value`` as a Python int, or raise an error that names ``name``.

    Any integer type is accepted (``int``, a NumPy integer, a one-element
    integer tensor); ``bool`` and floats are refused, even ``2.0``.

    Args:
        name: The argument's name, as the caller's signature spells it.
        value: What the caller passed.
        minimum: The smallest allowed value (inclusive), or None.
        maximum: The largest allowed value (inclusive), or None.

    Raises:
        TypeError: If ``value`` is not an integer (a bool is not).
        ValueError: If ``value`` lies outside ``[minimum, maximum]``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int (got bool {value!r})")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int (got {describe(value)})") from None
    if minimum is not None and number < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {allowed} (got {number})")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum} (got {number})")
    return number


def check_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
    finite: bool = True,
) -> float:
    """Return ``value`` as a Python float, or raise an error that names ``name``.

    Ints, floats and NumPy scalars are accepted; ``bool``, tensors, complex
    numbers and strings are refused.

    Args:
        name: The argument's name.
        value: What the caller passed.
        minimum: Smallest allowed value (inclusive), or None.
        above: ``value`` must be strictly greater than this, or None.
        maximum: Largest allowed value (inclusive), or None.
        below: ``value`` must be strictly less than this, or None.
        finite: Refuse NaN and infinities (the default). NaN is always refused.

    Raises:
        TypeError: If ``value`` is not a real number.
        ValueError: If it is NaN, infinite when ``finite``, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (got {describe(value)})")
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ValueError(f"{name} must be a finite number (got {number})")
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum} (got {value!r})")
    if above is not None and not number > above:
        raise ValueError(f"{name} must be > {above} (got {value!r})")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum} (got {value!r})")
    if below is not None and not number < below:
        raise ValueError(f"{name} must be < {below} (got {value!r})")
    return number


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool; otherwise raise TypeError naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False (got {describe(value)})")
    return value


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of the strings in ``choices``.

    Raises:
        TypeError: If ``value`` is not a string.
        ValueError: If it is a string that is not one of ``choices`` (the
            message lists them).
    """
    allowed = ", ".join(repr(choice) for choice in choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed} (got {describe(value)})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {allowed} (got {value!r})")
    return value


def check_tensor(
    name: str,
    value: object,
    *,
    dims: int | tuple[int, ...] | None = None,
    min_dims: int | None = None,
    floating: bool = False,
    dtype: torch.dtype | None = None,
    nonempty: bool = False,
) -> Tensor:
    """Return ``value`` if it is a tensor of the kind asked for.

    Args:
        name: The argument's name.
        value: What the caller passed.
        dims: The allowed number of dimensions (one int or a tuple), or None.
        min_dims: The fewest dimensions allowed, or None.
        floating: Require a floating-point dtype.
        dtype: Require exactly this dtype.
        nonempty: Refuse a tensor with no elements.

    Raises:
        TypeError: If ``value`` is not a tensor or has the wrong dtype.
        ValueError: If it has the wrong number of dimensions or is empty when
            ``nonempty``.
    """
    if not isinstance(value, Tensor):
        kind = "a floating-point tensor" if floating else "a tensor"
        raise TypeError(f"{name} must be {kind} (got {describe(value)})")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {describe(value)})")
    if dtype is not None and value.dtype != dtype:
        raise TypeError(f"{name} must be a tensor of dtype {dtype} (got {describe(value)})")
    if dims is not None:
        allowed = (dims,) if isinstance(dims, int) else tuple(dims)
        if value.dim() not in allowed:
            wanted = " or ".join(str(d) for d in allowed)
            raise ValueError(
                f"{name} must have {wanted} dimensions (got shape {tuple(value.shape)})"
            )
    if min_dims is not None and value.dim() < min_dims:
        raise ValueError(
            f"{name} must have at least {min_dims} dimensions (got shape {tuple(value.shape)})"
        )
    if nonempty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty (got shape {tuple(value.shape)})")
    return value
