"""Argument checks for the book's boundaries: TypeError for a wrong type, ValueError for a wrong value.

A boundary is where an argument enters from a person: a config dataclass, a layer or
model constructor, a reader of files, a driver (training, generation, experiments,
benchmarks). There each argument gets one line, ``heads = check_int("heads", heads,
minimum=1)``: the check names the argument, says what is allowed and what came, and
returns the value in its canonical form (a Python ``int`` for any integer type, a
``float`` for any real number). Kernels do not call these checks; they state their
shapes in a docstring and let PyTorch's own errors speak.

One helper per kind of check. The options of a check (``minimum``, ``dims``, ...)
are written by the book's code, not by a reader, so the checks trust them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


def describe(value: object) -> str:
    """Return a short description of ``value`` for an error message.

    A tensor by its dtype and shape, a number or string by its type and value,
    anything else by its type name.
    """
    if isinstance(value, Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    if isinstance(value, bool | numbers.Number | str):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def _type_name(kind: type) -> str:
    """Return how a message names a type: ``str``, ``torch.nn.Module``, ``GPTConfig``.

    A torch type is named by the shortest public path that reaches it
    (``torch.nn.Module``, not its home ``torch.nn.modules.module``).
    """
    if not kind.__module__.startswith("torch"):
        return kind.__name__
    parts = kind.__module__.split(".")
    for end in range(1, len(parts) + 1):
        path = ".".join(parts[:end])
        if getattr(sys.modules.get(path), kind.__name__, None) is kind:
            return f"{path}.{kind.__name__}"
    return f"{kind.__module__}.{kind.__name__}"


def _one_or_more(allowed: object) -> tuple:
    return tuple(allowed) if isinstance(allowed, tuple) else (allowed,)


def check_type(name: str, value: object, expected: type | tuple[type, ...]) -> object:
    """Return ``value`` if it is an instance of ``expected`` (a type or a tuple of types).

    For objects that are not numbers: a config, a model, a cache, a string, a
    ``torch.Generator``. Counts and reals have their own checks, which refuse ``bool``.
    """
    kinds = _one_or_more(expected)
    if not isinstance(value, kinds):
        wanted = " or ".join(_type_name(kind) for kind in kinds)
        raise TypeError(f"{name} must be a {wanted} (got {describe(value)})")
    return value


def check_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None, optional: bool = False
) -> int | None:
    """Return ``value`` as a Python int in ``[minimum, maximum]`` (either bound may be None).

    Any integer type will do (``int``, a NumPy integer, a one-element integer
    tensor); ``bool`` and floats are refused, even ``2.0``. With ``optional``,
    None (an argument left unset: no window, no seed) is returned as it is.
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
    """Return ``value`` if it divides ``total`` (heads into a width, KV heads into query heads).

    Both are counts already checked; ``into`` names ``total`` in the message.
    """
    if total % value:
        raise ValueError(f"{name} must divide {into} (got {name}={value} and {into}={total})")
    return value


def check_bits(name: str, value: object, allowed: Collection[int]) -> int:
    """Return ``value`` as an int if it is one of the bit widths a packer can hold.

    ``allowed`` is that packer's widths: ``range(2, 17)`` for absmax codes in
    int8 or int16, ``(4, 8)`` for nibble- or byte-packed tiles. A width outside
    it would not fail loudly later: one bit leaves no code but 0, and 17 bits
    wrap around in int16. So it is refused here, wherever bits enter.
    """
    bits = check_int(name, value)
    if bits not in allowed:
        if isinstance(allowed, range) and allowed.step == 1:
            widths = f"an integer from {allowed.start} to {allowed.stop - 1}"
        else:
            widths = "one of " + ", ".join(str(b) for b in sorted(allowed))
        raise ValueError(f"{name} must be {widths}, a width the packer can hold (got {bits})")
    return bits


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool (1 and 0 are not)."""
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
    """Return ``value`` as a Python float within the bounds given.

    ``minimum`` and ``maximum`` are inclusive, ``above`` and ``below`` strict.
    NaN is always refused, infinities unless ``finite=False``; ``bool``,
    tensors, complex numbers and strings are refused.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (got {describe(value)})")
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ValueError(f"{name} must be a finite number (got {number})")
    for bound, limit, inside in (
        (">=", minimum, operator.ge), (">", above, operator.gt), ("<=", maximum, operator.le), ("<", below, operator.lt)
    ):
        if limit is not None and not inside(number, limit):
            raise ValueError(f"{name} must be {bound} {limit} (got {value!r})")
    return number


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of the strings in ``choices`` (the message lists them)."""
    allowed = ", ".join(repr(choice) for choice in choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {allowed} (got {describe(value)})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {allowed} (got {value!r})")
    return value


def check_device(name: str, value: object) -> torch.device:
    """Return ``value`` as a ``torch.device``; it may be a device or a name such as ``"cpu"``."""
    if not isinstance(value, torch.device | str):
        raise TypeError(f"{name} must be a torch.device or a device name such as 'cpu' (got {describe(value)})")
    try:
        return torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must name a device torch knows, such as 'cpu' or 'cuda:0' (got {value!r})") from None


def check_dtype(name: str, value: object, *, floating: bool = False) -> torch.dtype:
    """Return ``value`` if it is a ``torch.dtype``, a floating-point one if ``floating``."""
    check_type(name, value, torch.dtype)
    if floating and not value.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype (got {value})")
    return value


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

    ``dims`` is the allowed number of dimensions (an int or a tuple), ``min_dims``
    the fewest; ``floating`` asks for a floating-point dtype and ``dtype`` for
    one dtype or a tuple of them; ``nonempty`` refuses a tensor with no
    elements; ``sizes`` maps dimensions to required sizes (``{-1: 64}``: a last
    dimension of 64). A wrong kind or dtype is a TypeError, a wrong shape a
    ValueError.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be {'a floating-point tensor' if floating else 'a tensor'} (got {describe(value)})")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {describe(value)})")
    if dtype is not None and value.dtype not in _one_or_more(dtype):
        wanted = " or ".join(str(kind) for kind in _one_or_more(dtype))
        raise TypeError(f"{name} must be a tensor of dtype {wanted} (got {describe(value)})")
    shape = tuple(value.shape)
    if dims is not None and value.dim() not in _one_or_more(dims):
        wanted = " or ".join(str(d) for d in _one_or_more(dims))
        raise ValueError(f"{name} must have {wanted} dimensions (got shape {shape})")
    if min_dims is not None and value.dim() < min_dims:
        raise ValueError(f"{name} must have at least {min_dims} dimensions (got shape {shape})")
    if nonempty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty (got shape {shape})")
    for dim, size in (sizes or {}).items():
        if not -value.dim() <= dim < value.dim() or shape[dim] != size:
            raise ValueError(f"{name} must have size {size} in dimension {dim} (got shape {shape})")
    return value


def check_attention_inputs(
    query: object, key: object, value: object, *, same_tokens: bool = False
) -> tuple[int, ...]:
    """Check the three tensors of an attention call; return the scores' shape ``(..., T_q, T_k)``.

    ``query`` is ``(..., T_q, d)``, ``key`` ``(..., T_k, d)`` and ``value``
    ``(..., T_k, d_v)``: non-empty floating-point tensors of one dtype whose
    leading dimensions broadcast. With ``same_tokens`` (blockwise, ring and
    linear attention, which split one sequence) ``query`` and ``key`` must
    have the same shape and ``value`` the same ``(..., T)``.
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


def check_int_sequence(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    nonempty: bool = False,
    min_length: int = 0,
    max_length: int | None = None,
) -> Tensor:
    """Return a sequence of integers (token ids, say) as a 1-d int64 tensor.

    A list, a tuple, a ``range``, a NumPy array or a 1-d integer tensor will do;
    floats, bools and strings are refused rather than rounded. Entries must lie
    in ``[minimum, maximum]``; ``nonempty`` refuses an empty sequence,
    ``min_length`` a shorter one (a text too short for one training window)
    and ``max_length`` a longer one (a prompt longer than the model's context).
    """
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
    if ids.numel() < min_length:
        raise ValueError(f"{name} must hold at least {min_length} entries (got {ids.numel()})")
    if max_length is not None and ids.numel() > max_length:
        raise ValueError(f"{name} must hold at most {max_length} entries (got {ids.numel()})")
    if ids.numel() and minimum is not None and int(ids.min()) < minimum:
        raise ValueError(f"{name} must hold integers >= {minimum} (got {int(ids.min())})")
    if ids.numel() and maximum is not None and int(ids.max()) > maximum:
        raise ValueError(f"{name} must hold integers <= {maximum} (got {int(ids.max())})")
    return ids.long()


#: The default of a ``Field`` that must be present.
REQUIRED = object()


@dataclass(frozen=True)
class Field:
    """How one field of a config, or one argument of a call, is checked.

    ``kind`` picks the check: ``"int"`` (``check_int``), ``"number"``
    (``check_number``), ``"choice"`` (``check_choice``, among ``choices``),
    ``"bits"`` (``check_bits``, a width among ``choices``), ``"bool"``,
    ``"str"``, ``"mapping"``, or ``"type"`` (``check_type``, an instance of
    ``types``). ``minimum``, ``above``, ``maximum`` and ``below``
    bound a count or a number; ``multiple_of`` asks for a multiple (2: even).
    A bound given as a string names another field of the same call, and
    ``divides`` names a count this one must divide (heads into a width):
    ``needs`` names a field that must be set (not None) when this one is
    set and not 0 or False (windowed layers need a window width). Those
    relations are checked once every field has its own type.
    ``default`` is what an absent or null field reads as; ``default=None``
    also lets an argument be None (no window, no seed). Without a default a
    config must hold the field, and an argument may not be None.
    """

    kind: str = "int"
    minimum: float | str | None = None
    above: float | str | None = None
    maximum: float | str | None = None
    below: float | str | None = None
    choices: Collection = ()
    types: type | tuple[type, ...] = ()
    multiple_of: int | None = None
    divides: str | None = None
    needs: str | None = None
    default: object = REQUIRED


#: A positive count, a count that may be 0, a seed, a flag, a positive real.
COUNT = Field(minimum=1)
SIZE = Field(minimum=0)
SEED = Field(minimum=0)
FLAG = Field("bool")
POSITIVE = Field("number", above=0)

_RELATIONS = (("minimum", "be at least", operator.ge), ("above", "exceed", operator.gt),
              ("maximum", "be at most", operator.le), ("below", "be below", operator.lt))


def _read_field(name: str, value: object, field: Field) -> object:
    """Check ``value`` by its field's kind and its own (numeric) bounds."""
    own = {key: getattr(field, key) for key, _, _ in _RELATIONS
           if not isinstance(getattr(field, key), str)}
    if field.kind == "int":
        above, below = own.pop("above"), own.pop("below")
        number = check_int(name, value, **own)
        if field.multiple_of and number % field.multiple_of:
            wanted = "even" if field.multiple_of == 2 else f"a multiple of {field.multiple_of}"
            raise ValueError(f"{name} must be {wanted} (got {number})")
        for bound, limit, inside in ((">", above, operator.gt), ("<", below, operator.lt)):
            if limit is not None and not inside(number, limit):
                raise ValueError(f"{name} must be an integer {bound} {limit} (got {number})")
        return number
    if field.kind == "number":
        return check_number(name, value, **own)
    if field.kind == "choice":
        return check_choice(name, value, field.choices)
    if field.kind == "bits":
        return check_bits(name, value, field.choices)
    if field.kind == "bool":
        return check_bool(name, value)
    if field.kind == "str":
        return check_type(name, value, str)
    if field.kind == "type":
        return check_type(name, value, field.types)
    return check_type(name, value, Mapping)


def _check_relations(values: Mapping[str, object], fields: Mapping[str, Field]) -> None:
    """Check the bounds that name another field, ``divides`` and ``needs``, on values already read."""
    for key, field in fields.items():
        value = values[key]
        if value is None:
            continue
        for attribute, bound, inside in _RELATIONS:
            other = getattr(field, attribute)
            if isinstance(other, str) and values[other] is not None and not inside(value, values[other]):
                raise ValueError(f"{key} must {bound} {other} (got {key}={value} and {other}={values[other]})")
        if field.divides is not None and values[field.divides] is not None:
            check_divides(key, value, field.divides, values[field.divides])
        if field.needs is not None and value and values[field.needs] is None:
            raise ValueError(f"{key}={value!r} needs {field.needs} (got {field.needs}=None)")


def _is_record(value: object, fields: Mapping[str, Field]) -> bool:
    """Whether ``value`` is a dataclass instance holding every field of ``fields``."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return False
    return set(fields) <= {f.name for f in dataclasses.fields(value)}


def check_fields(
    mapping: object, fields: Mapping[str, Field], *, name: str = "mapping", source: str = "config"
) -> dict[str, object]:
    """Return the fields named in ``fields``, each read as its ``Field`` says.

    ``mapping`` is a config mapping (a parsed config.json), or a dataclass
    instance checking its own fields: ``check_fields(self, FIELDS)`` in a
    ``__post_init__``, which stores each value back in its canonical form
    (a plain int or float), frozen or not.

    From a mapping, a field that is absent or null takes its ``Field``'s
    default; without one it is a ValueError (``"config is missing required
    field 'head_dim'"``, ``source`` naming the mapping). On a dataclass a
    field is always present: None is allowed where the default is None and
    is a TypeError elsewhere. Anything else is a TypeError naming ``mapping``
    by ``name``. A field of the wrong type is a TypeError, out of range a
    ValueError, each naming the field.
    """
    if _is_record(mapping, fields):
        values = _read_arguments({key: getattr(mapping, key) for key in fields}, fields)
        for key, value in values.items():
            object.__setattr__(mapping, key, value)  # a frozen dataclass too
        return values
    check_type(name, mapping, Mapping)
    values = {}
    for key, field in fields.items():
        value = mapping.get(key)
        if value is not None:
            values[key] = _read_field(key, value, field)
        elif field.default is REQUIRED:
            raise ValueError(f"{source} is missing required field {key!r}")
        else:
            values[key] = field.default
    _check_relations(values, fields)
    return values


def _read_arguments(values: Mapping[str, object], fields: Mapping[str, Field]) -> dict[str, object]:
    read = {}
    for key, field in fields.items():
        value = values[key]
        read[key] = None if value is None and field.default is None else _read_field(key, value, field)
    _check_relations(read, fields)
    return read


def check_arguments(**arguments: tuple[object, Field]) -> tuple:
    """Check several arguments in one call; return their values in canonical form, in order.

    Each keyword is an argument's name and its ``(value, Field)``:
    ``steps, seed = check_arguments(steps=(steps, COUNT), seed=(seed, SEED))``.
    Each value is checked as ``check_fields`` checks a dataclass's field: by
    kind and bounds, None only where the ``Field``'s default is None, and a
    bound or ``divides`` may name another argument of the call.
    """
    values = {key: value for key, (value, _) in arguments.items()}
    fields = {key: field for key, (_, field) in arguments.items()}
    return tuple(_read_arguments(values, fields).values())
