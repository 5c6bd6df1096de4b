"""Argument checks for the book's boundaries: TypeError for a wrong type, ValueError for a wrong value.

At a boundary (a config dataclass, a constructor, a reader, a driver) each argument gets
one line, ``heads = check_int("heads", heads, minimum=1)``, and each relation one more,
``check_divides("heads", heads, "d_model", d_model)`` or an ``if`` that raises. A check
names the argument, says what is allowed and what came, and returns the value in its
canonical form (a Python ``int`` for any integer type, a ``float`` for any real number).
Kernels do not call these checks. The options of a check are the book's, so it trusts them.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from collections.abc import Collection, Iterable, Mapping

import torch
from torch import Tensor


def describe(value: object) -> str:
    """Describe ``value`` for a message: a tensor by dtype and shape, a number or string by value, else its type."""
    if isinstance(value, Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    if isinstance(value, bool | numbers.Number | str):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def _type_name(kind: type) -> str:
    """Name a type for a message: ``GPTConfig``, or a torch type by its shortest public path (``torch.nn.Module``)."""
    parts = kind.__module__.split(".")
    if parts[0] == "torch":
        for path in (".".join(parts[:end]) for end in range(1, len(parts) + 1)):
            if getattr(sys.modules.get(path), kind.__name__, None) is kind:
                return f"{path}.{kind.__name__}"
    return kind.__name__


def _one_or_more(allowed: object) -> tuple:
    return tuple(allowed) if isinstance(allowed, tuple) else (allowed,)


def check_type(name: str, value: object, expected: type | tuple[type, ...], *, optional: bool = False) -> object:
    """Return ``value`` if it is an instance of ``expected`` (a type or a tuple); None if ``optional``."""
    kinds = _one_or_more(expected)
    if not isinstance(value, kinds) and not (optional and value is None):
        raise TypeError(f"{name} must be a {' or '.join(_type_name(kind) for kind in kinds)} (got {describe(value)})")
    return value


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None,
              optional: bool = False) -> int | None:
    """Return ``value`` as a Python int in ``[minimum, maximum]`` (either bound may be None).

    Any integer type will do (``int``, a NumPy integer, a one-element integer tensor); ``bool``
    and floats are refused, even ``2.0``. With ``optional``, None (unset) is returned as it is.
    """
    if optional and value is None:
        return None
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


def check_divides(name: str, value: int, into: str, total: int) -> int:
    """Return ``value`` if it divides ``total`` (heads into a width); ``into`` names ``total``."""
    if total % value:
        raise ValueError(f"{name} must divide {into} (got {name}={value} and {into}={total})")
    return value


def check_bits(name: str, value: object, allowed: Collection[int]) -> int:
    """Return ``value`` as an int if it is one of the bit widths ``allowed`` a packer can hold.

    A width outside them would not fail loudly later (one bit leaves no code but 0,
    17 bits wrap around in int16), so it is refused wherever bits enter.
    """
    bits = check_int(name, value)
    if bits not in allowed:
        widths = (f"an integer from {allowed.start} to {allowed.stop - 1}" if isinstance(allowed, range)
                  else "one of " + ", ".join(str(b) for b in sorted(allowed)))
        raise ValueError(f"{name} must be {widths}, a width the packer can hold (got {bits})")
    return bits


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool (1 and 0 are not)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False (got {describe(value)})")
    return value


def check_number(name: str, value: object, *, minimum: float | None = None, above: float | None = None,
                 maximum: float | None = None, below: float | None = None, optional: bool = False) -> float | None:
    """Return ``value`` as a Python float within the bounds given.

    ``minimum`` and ``maximum`` are inclusive, ``above`` and ``below`` strict. NaN, infinities,
    ``bool``, tensors, complex numbers and strings are refused; with ``optional``, None passes.
    """
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (got {describe(value)})")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number (got {number})")
    for bound, limit, inside in ((">=", minimum, operator.ge), (">", above, operator.gt),
                                 ("<=", maximum, operator.le), ("<", below, operator.lt)):
        if limit is not None and not inside(number, limit):
            raise ValueError(f"{name} must be {bound} {limit} (got {value!r})")
    return number


def check_choice(name: str, value: object, choices: Collection[str], *, optional: bool = False) -> str | None:
    """Return ``value`` if it is one of the strings ``choices`` (listed in the message); None if ``optional``."""
    allowed = ", ".join(repr(choice) for choice in choices)
    if optional and value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed} (got {describe(value)})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {allowed} (got {value!r})")
    return value


def config_value(mapping: Mapping, key: str, default: object = ..., *, source: str = "config") -> object:
    """Return ``mapping[key]``; absent or null (a config's null means unset), ``default``, else a ValueError."""
    if mapping.get(key) is not None:
        return mapping[key]
    if default is ...:
        raise ValueError(f"{source} is missing required field {key!r}")
    return default


def check_device(name: str, value: object) -> torch.device:
    """Return ``value`` as a ``torch.device``; it may be a device or a name such as ``"cpu"``."""
    if not isinstance(value, torch.device | str):
        raise TypeError(f"{name} must be a torch.device or a device name such as 'cpu' (got {describe(value)})")
    try:
        return torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must name a device torch knows, such as 'cpu' or 'cuda:0' (got {value!r})") from None


def check_dtype(name: str, value: object) -> torch.dtype:
    """Return ``value`` if it is a ``torch.dtype``."""
    return check_type(name, value, torch.dtype)


def check_tensor(name: str, value: object, *, dims: int | tuple[int, ...] | None = None, min_dims: int | None = None,
                 floating: bool = False, dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
                 nonempty: bool = False, sizes: Mapping[int, int] | None = None) -> Tensor:
    """Return ``value`` if it is a tensor of the kind asked for.

    ``dims``: the allowed numbers of dimensions, ``min_dims`` the fewest; ``floating``
    or ``dtype`` (one or a tuple) the dtype; ``nonempty`` refuses no elements; ``sizes``
    maps dimensions to sizes (``{-1: 64}``). A wrong kind or dtype is a TypeError, a
    wrong shape a ValueError.
    """
    if not isinstance(value, Tensor) or (floating and not value.is_floating_point()):
        raise TypeError(f"{name} must be {'a floating-point tensor' if floating else 'a tensor'} (got {describe(value)})")
    if dtype is not None and value.dtype not in _one_or_more(dtype):
        wanted = " or ".join(str(kind) for kind in _one_or_more(dtype))
        raise TypeError(f"{name} must be a tensor of dtype {wanted} (got {describe(value)})")
    shape = tuple(value.shape)
    if dims is not None and value.dim() not in _one_or_more(dims):
        raise ValueError(f"{name} must have {' or '.join(map(str, _one_or_more(dims)))} dimensions (got shape {shape})")
    if min_dims is not None and value.dim() < min_dims:
        raise ValueError(f"{name} must have at least {min_dims} dimensions (got shape {shape})")
    if nonempty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty (got shape {shape})")
    for dim, size in (sizes or {}).items():
        if not -value.dim() <= dim < value.dim() or shape[dim] != size:
            raise ValueError(f"{name} must have size {size} in dimension {dim} (got shape {shape})")
    return value


def check_attention_inputs(query: object, key: object, value: object, *, same_tokens: bool = False) -> tuple[int, ...]:
    """Check the three tensors of an attention call; return the scores' shape ``(..., T_q, T_k)``.

    ``query`` ``(..., T_q, d)``, ``key`` ``(..., T_k, d)``, ``value`` ``(..., T_k, d_v)``:
    non-empty floating-point tensors of one dtype whose leading dimensions broadcast.
    With ``same_tokens`` (ring and linear attention, which split one sequence) query
    and key must have one shape and value the same ``(..., T)``.
    """
    tensors = {"query": query, "key": key, "value": value}
    for name, tensor in tensors.items():
        check_tensor(name, tensor, min_dims=2, floating=True, nonempty=True)
    shapes = ", ".join(f"{name} {tuple(tensor.shape)}" for name, tensor in tensors.items())
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share one dtype (got {query.dtype}, {key.dtype} and {value.dtype})")
    if same_tokens and (key.shape != query.shape or value.shape[:-1] != query.shape[:-1]):
        raise ValueError(f"query and key must be (..., T, d) alike and value (..., T, d_v) (got {shapes})")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"query and key must share d, and key and value T_k (got {shapes})")
    try:
        leading = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading dimensions of query, key and value must broadcast (got {shapes})") from None
    return (*leading, query.shape[-2], key.shape[-2])


def check_int_sequence(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None,
                       nonempty: bool = False, min_length: int = 0, max_length: int | None = None) -> Tensor:
    """Return a sequence of integers (token ids, say) as a 1-d int64 tensor.

    A list, tuple, ``range``, NumPy array or 1-d integer tensor will do; floats, bools
    and strings are refused, not rounded. Entries lie in ``[minimum, maximum]``;
    ``nonempty``, ``min_length`` (a text too short for a window) and ``max_length`` (a
    prompt longer than the context) bound the length.
    """
    wanted = f"{name} must be a sequence of integers"
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{wanted} (got {describe(value)})")
    if isinstance(value, Tensor):
        ids = value
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
    if ids.numel() < min_length:
        raise ValueError(f"{name} must hold at least {min_length} entries (got {ids.numel()})")
    if max_length is not None and ids.numel() > max_length:
        raise ValueError(f"{name} must hold at most {max_length} entries (got {ids.numel()})")
    if ids.numel() and minimum is not None and int(ids.min()) < minimum:
        raise ValueError(f"{name} must hold integers >= {minimum} (got {int(ids.min())})")
    if ids.numel() and maximum is not None and int(ids.max()) > maximum:
        raise ValueError(f"{name} must hold integers <= {maximum} (got {int(ids.max())})")
    return ids.long()
