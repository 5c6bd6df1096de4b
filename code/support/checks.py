"""Argument checks: TypeError for a wrong type, ValueError for a wrong value.

Every check takes the argument's name first, so the message can say which argument was
wrong (``kv_heads must be a positive integer (got 0)``), and returns the value in its
canonical form (a Python ``int`` for any integer type, a ``float`` for any real number),
so a caller writes ``heads = check_int("heads", heads, minimum=1)`` and moves on.

The checks hold themselves to the same rule: an option of a check that is itself
malformed (``check_int("heads", 4, minimum=True)``) raises TypeError or ValueError
naming that option. ``check_type`` is the one place where ``isinstance`` is written
out for a name; everything else goes through the checks.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Collection, Iterable, Mapping

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


def _type_name(kind: type) -> str:
    """Return how an error message names a type: ``str``, ``torch.Generator``, ``GPTConfig``."""
    return f"torch.{kind.__name__}" if kind.__module__.startswith("torch") else kind.__name__


def check_type(name: str, value: object, expected: type | tuple[type, ...]) -> object:
    """Return ``value`` if it is an instance of ``expected``; otherwise raise TypeError naming ``name``.

    For objects that are not numbers: a config, a model, a cache, a string, a
    ``torch.Generator``. Counts and reals have their own checks
    (``check_int``, ``check_number``), which also refuse ``bool``.

    Args:
        name: The argument's name.
        value: What the caller passed.
        expected: A type, or a non-empty tuple of types any of which will do.

    Raises:
        TypeError: If ``value`` is not an instance of ``expected`` (or if
            ``name`` is not a string or ``expected`` is not a type or tuple
            of types).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (got {describe(name)})")
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if not kinds or not all(isinstance(kind, type) for kind in kinds):
        raise TypeError(f"expected must be a type or a non-empty tuple of types (got {describe(expected)})")
    if not isinstance(value, kinds):
        wanted = " or ".join(_type_name(kind) for kind in kinds)
        raise TypeError(f"{name} must be a {wanted} (got {describe(value)})")
    return value


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
    check_type("name", name, str)
    if minimum is not None:
        minimum = check_int("minimum", minimum)
    if maximum is not None:
        maximum = check_int("maximum", maximum)
    if minimum is not None and maximum is not None and minimum > maximum:
        raise ValueError(f"minimum must be <= maximum (got {minimum} and {maximum})")
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


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool; otherwise raise TypeError naming ``name``."""
    check_type("name", name, str)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False (got {describe(value)})")
    return value


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
    check_type("name", name, str)
    bounds = {"minimum": minimum, "above": above, "maximum": maximum, "below": below}
    for bound, limit in bounds.items():
        if limit is not None:
            check_number(bound, limit, finite=False)
    finite = check_bool("finite", finite)
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


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of the strings in ``choices``.

    Raises:
        TypeError: If ``value`` is not a string (or ``choices`` is not a
            collection of strings).
        ValueError: If it is a string that is not one of ``choices`` (the
            message lists them), or ``choices`` is empty.
    """
    check_type("name", name, str)
    if isinstance(choices, str) or not isinstance(choices, Collection):
        raise TypeError(f"choices must be a collection of strings (got {describe(choices)})")
    for choice in choices:
        check_type("choices", choice, str)
    if not choices:
        raise ValueError("choices must not be empty")
    allowed = ", ".join(repr(choice) for choice in choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed} (got {describe(value)})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {allowed} (got {value!r})")
    return value


def check_device(name: str, value: object) -> torch.device:
    """Return ``value`` as a ``torch.device``; it may be a device or a name such as ``"cpu"``.

    Raises:
        TypeError: If ``value`` is neither a ``torch.device`` nor a string.
        ValueError: If it is a string that names no device type torch knows.
    """
    check_type("name", name, str)
    if not isinstance(value, torch.device | str):
        raise TypeError(f"{name} must be a torch.device or a device name such as 'cpu' (got {describe(value)})")
    try:
        return torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must name a device torch knows, such as 'cpu' or 'cuda:0' (got {value!r})") from None


def check_tensor(
    name: str,
    value: object,
    *,
    dims: int | tuple[int, ...] | None = None,
    min_dims: int | None = None,
    floating: bool = False,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    nonempty: bool = False,
    sizes: Mapping[int, int] | None = None,
) -> Tensor:
    """Return ``value`` if it is a tensor of the kind asked for.

    Args:
        name: The argument's name.
        value: What the caller passed.
        dims: The allowed number of dimensions (one int or a tuple), or None.
        min_dims: The fewest dimensions allowed, or None.
        floating: Require a floating-point dtype.
        dtype: Require this dtype, or one of a tuple of dtypes.
        nonempty: Refuse a tensor with no elements.
        sizes: Required sizes of some dimensions, ``{dimension: size}``;
            ``{-1: 64}`` asks for a last dimension of 64.

    Raises:
        TypeError: If ``value`` is not a tensor or has the wrong dtype.
        ValueError: If it has the wrong number of dimensions, is empty when
            ``nonempty``, or has a wrong size in one of ``sizes``.
    """
    check_type("name", name, str)
    allowed_dims = None
    if dims is not None:
        allowed_dims = tuple(dims) if isinstance(dims, tuple) else (dims,)
        allowed_dims = tuple(check_int("dims", d, minimum=0) for d in allowed_dims)
    if min_dims is not None:
        min_dims = check_int("min_dims", min_dims, minimum=0)
    floating = check_bool("floating", floating)
    allowed_dtypes = None
    if dtype is not None:
        allowed_dtypes = tuple(dtype) if isinstance(dtype, tuple) else (dtype,)
        for kind in allowed_dtypes:
            check_type("dtype", kind, torch.dtype)
    nonempty = check_bool("nonempty", nonempty)
    required = {}
    if sizes is not None:
        check_type("sizes", sizes, Mapping)
        required = {check_int("sizes", d): check_int("sizes", s, minimum=0) for d, s in sizes.items()}

    if not isinstance(value, Tensor):
        kind = "a floating-point tensor" if floating else "a tensor"
        raise TypeError(f"{name} must be {kind} (got {describe(value)})")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {describe(value)})")
    if allowed_dtypes is not None and value.dtype not in allowed_dtypes:
        wanted = " or ".join(str(d) for d in allowed_dtypes)
        raise TypeError(f"{name} must be a tensor of dtype {wanted} (got {describe(value)})")
    shape = tuple(value.shape)
    if allowed_dims is not None and value.dim() not in allowed_dims:
        wanted = " or ".join(str(d) for d in allowed_dims)
        raise ValueError(f"{name} must have {wanted} dimensions (got shape {shape})")
    if min_dims is not None and value.dim() < min_dims:
        raise ValueError(f"{name} must have at least {min_dims} dimensions (got shape {shape})")
    if nonempty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty (got shape {shape})")
    for dim, size in required.items():
        if not -value.dim() <= dim < value.dim() or shape[dim] != size:
            raise ValueError(f"{name} must have size {size} in dimension {dim} (got shape {shape})")
    return value


def check_int_sequence(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    nonempty: bool = False,
) -> Tensor:
    """Return a sequence of integers (token ids, say) as a 1-d int64 tensor.

    A list, a tuple, a ``range``, a NumPy array or a 1-d integer tensor will
    do; floats, bools and strings are refused rather than rounded.

    Args:
        name: The argument's name.
        value: What the caller passed.
        minimum: The smallest allowed entry (inclusive), or None.
        maximum: The largest allowed entry (inclusive), or None.
        nonempty: Refuse a sequence with no entries.

    Raises:
        TypeError: If ``value`` is not a sequence of integers.
        ValueError: If it is not one-dimensional, is empty when ``nonempty``,
            or has an entry outside ``[minimum, maximum]``.
    """
    check_type("name", name, str)
    if minimum is not None:
        minimum = check_int("minimum", minimum)
    if maximum is not None:
        maximum = check_int("maximum", maximum, minimum=minimum)
    nonempty = check_bool("nonempty", nonempty)
    wanted = f"{name} must be a sequence of integers"
    if isinstance(value, Tensor):
        ids = value
    elif isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{wanted} (got {describe(value)})")
    else:
        entries = list(value)
        try:
            ids = torch.as_tensor(entries) if entries else torch.empty(0, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{wanted} (got a {type(value).__name__} whose entries are not all integers)") from None
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{wanted} (got entries of dtype {ids.dtype})")
    if ids.dim() != 1:
        raise ValueError(f"{wanted}, one-dimensional (got shape {tuple(ids.shape)})")
    if nonempty and ids.numel() == 0:
        raise ValueError(f"{name} must not be empty")
    if ids.numel() and minimum is not None and int(ids.min()) < minimum:
        raise ValueError(f"{name} must hold integers >= {minimum} (got {int(ids.min())})")
    if ids.numel() and maximum is not None and int(ids.max()) > maximum:
        raise ValueError(f"{name} must hold integers <= {maximum} (got {int(ids.max())})")
    return ids.long()
