"""Tests for longctx.support: the argument checks every chapter uses, the figure style, the data folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from longctx import support

# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize("value", [3, np.int64(3), torch.tensor(3)])
def test_check_int_accepts_every_integer_type_and_returns_a_python_int(value):
    result = support.check_int("heads", value, minimum=1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize("value", [True, 2.0, 2.5, "2", None, torch.tensor(2.0), torch.tensor([1, 2])])
def test_check_int_refuses_non_integers_with_type_error_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"^heads must be an int \(got "):
        support.check_int("heads", value)


def test_check_int_range_messages_say_what_is_allowed():
    with pytest.raises(ValueError, match=r"^heads must be a positive integer \(got 0\)$"):
        support.check_int("heads", 0, minimum=1)
    with pytest.raises(ValueError, match=r"^sinks must be an integer >= 0 \(got -1\)$"):
        support.check_int("sinks", -1, minimum=0)
    with pytest.raises(ValueError, match=r"^bits must be an integer <= 16 \(got 17\)$"):
        support.check_int("bits", 17, maximum=16)
    assert support.check_int("sinks", 0, minimum=0) == 0


@pytest.mark.parametrize("value", [2, 2.5, np.float32(2.5)])
def test_check_number_accepts_reals_and_returns_a_float(value):
    result = support.check_number("base", value, above=1)
    assert result == float(value) and type(result) is float


@pytest.mark.parametrize("value", [True, "2", None, 1j, torch.tensor(2.0)])
def test_check_number_refuses_non_reals(value):
    with pytest.raises(TypeError, match=r"^base must be a real number \(got "):
        support.check_number("base", value)


def test_check_number_bounds_and_non_finite_values():
    with pytest.raises(ValueError, match=r"^base must be > 1"):
        support.check_number("base", 1.0, above=1)
    with pytest.raises(ValueError, match=r"^factor must be >= 1"):
        support.check_number("factor", 0.5, minimum=1)
    with pytest.raises(ValueError, match=r"^p must be <= 1"):
        support.check_number("p", 1.5, maximum=1)
    with pytest.raises(ValueError, match=r"^p must be < 1"):
        support.check_number("p", 1.0, below=1)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="must be a finite number"):
            support.check_number("scale", bad)
    assert support.check_number("limit", float("inf"), finite=False) == float("inf")
    with pytest.raises(ValueError, match="finite"):
        support.check_number("limit", float("nan"), finite=False)


def test_check_choice_and_check_bool():
    assert support.check_choice("method", "yarn", ("rope", "yarn")) == "yarn"
    with pytest.raises(ValueError, match=r"^method must be one of 'rope', 'yarn' \(got 'alibi'\)$"):
        support.check_choice("method", "alibi", ("rope", "yarn"))
    with pytest.raises(TypeError, match="method must be one of"):
        support.check_choice("method", 3, ("rope", "yarn"))
    assert support.check_bool("causal", False) is False
    with pytest.raises(TypeError, match=r"^causal must be True or False \(got int 1\)$"):
        support.check_bool("causal", 1)


def test_check_tensor_kind_rank_and_emptiness():
    x = torch.zeros(2, 3)
    assert support.check_tensor("x", x, dims=2, floating=True) is x
    assert support.check_tensor("x", x, dims=(2, 3)) is x
    with pytest.raises(TypeError, match=r"^x must be a floating-point tensor \(got list\)$"):
        support.check_tensor("x", [1.0], floating=True)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        support.check_tensor("x", torch.zeros(2, dtype=torch.long), floating=True)
    with pytest.raises(TypeError, match=r"mask must be a tensor of dtype torch.bool"):
        support.check_tensor("mask", torch.zeros(2), dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^x must have 3 or 4 dimensions \(got shape \(2, 3\)\)$"):
        support.check_tensor("x", x, dims=(3, 4))
    with pytest.raises(ValueError, match=r"at least 3 dimensions"):
        support.check_tensor("x", x, min_dims=3)
    with pytest.raises(ValueError, match=r"^x must not be empty"):
        support.check_tensor("x", torch.zeros(0, 3), nonempty=True)


def test_describe_names_dtype_and_shape_of_tensors_and_value_of_scalars():
    assert support.describe(torch.zeros(2, 3)) == "tensor of dtype torch.float32 and shape (2, 3)"
    assert support.describe(2.5) == "float 2.5"
    assert support.describe(True) == "bool True"
    assert support.describe([1]) == "list"


def test_check_type_names_the_expected_types():
    assert support.check_type("config", "x", str) == "x"
    with pytest.raises(TypeError, match=r"^generator must be a torch.Generator \(got int 7\)$"):
        support.check_type("generator", 7, torch.Generator)
    with pytest.raises(TypeError, match=r"^device must be a str or torch.device \(got float 0.5\)$"):
        support.check_type("device", 0.5, (str, torch.device))


def test_check_device_accepts_devices_and_their_names():
    assert support.check_device("device", "cpu") == torch.device("cpu")
    assert support.check_device("device", torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^device must name a device torch knows, such as 'cpu' or 'cuda:0' \(got 'cpux'\)$"):
        support.check_device("device", "cpux")
    with pytest.raises(TypeError, match=r"^device must be a torch.device or a device name"):
        support.check_device("device", 0)


@pytest.mark.parametrize("ids", [[3, 1, 2], (3, 1, 2), np.array([3, 1, 2]), torch.tensor([3, 1, 2], dtype=torch.int32)])
def test_check_int_sequence_accepts_lists_tuples_arrays_and_tensors(ids):
    result = support.check_int_sequence("ids", ids, minimum=0, maximum=3)
    assert result.dtype == torch.int64 and result.tolist() == [3, 1, 2]
    assert support.check_int_sequence("ids", range(4)).tolist() == [0, 1, 2, 3]
    assert support.check_int_sequence("ids", []).shape == (0,)


@pytest.mark.parametrize(
    "ids, error, message",
    [
        ([1.5, 2.0], TypeError, r"^ids must be a sequence of integers \(got entries of dtype torch.float32\)$"),
        ([True, False], TypeError, "entries of dtype torch.bool"),
        ("abc", TypeError, r"\(got str 'abc'\)$"),
        (7, TypeError, r"\(got int 7\)$"),
        (["a", "b"], TypeError, "whose entries are not all integers"),
        ([[1, 2], [3, 4]], ValueError, r"one-dimensional \(got shape \(2, 2\)\)$"),
        ([], ValueError, "^ids must not be empty$"),
        ([0, 9], ValueError, r"^ids must hold integers <= 5 \(got 9\)$"),
        ([-1, 0], ValueError, r"^ids must hold integers >= 0 \(got -1\)$"),
    ],
)
def test_check_int_sequence_refuses_what_it_would_otherwise_round_or_misread(ids, error, message):
    with pytest.raises(error, match=message):
        support.check_int_sequence("ids", ids, minimum=0, maximum=5, nonempty=True)


def test_check_tensor_dtype_tuples_and_sizes():
    ids = torch.zeros(2, 3, dtype=torch.int32)
    assert support.check_tensor("ids", ids, dtype=(torch.int64, torch.int32)) is ids
    with pytest.raises(TypeError, match=r"^ids must be a tensor of dtype torch.int64 or torch.int32 \(got "):
        support.check_tensor("ids", ids.float(), dtype=(torch.int64, torch.int32))
    x = torch.zeros(2, 3, 4)
    assert support.check_tensor("x", x, sizes={0: 2, -1: 4}) is x
    with pytest.raises(ValueError, match=r"^x must have size 5 in dimension -1 \(got shape \(2, 3, 4\)\)$"):
        support.check_tensor("x", x, sizes={-1: 5})
    with pytest.raises(ValueError, match=r"^x must have size 1 in dimension 3"):
        support.check_tensor("x", x, sizes={3: 1})  # a dimension x does not have


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: support.check_int(3, 4), TypeError, r"^name must be a str \(got int 3\)$"),
        (lambda: support.check_int("heads", 4, minimum=True), TypeError, "^minimum must be an int"),
        (lambda: support.check_int("heads", 4, minimum=5, maximum=2), ValueError, r"^minimum must be <= maximum"),
        (lambda: support.check_number("p", 0.5, below="1"), TypeError, "^below must be a real number"),
        (lambda: support.check_number("p", 0.5, finite=1), TypeError, "^finite must be True or False"),
        (lambda: support.check_bool(None, True), TypeError, "^name must be a str"),
        (lambda: support.check_choice("method", "rope", "rope"), TypeError, "^choices must be a collection of strings"),
        (lambda: support.check_choice("method", "rope", [1]), TypeError, "^choices must be a str"),
        (lambda: support.check_choice("method", "rope", []), ValueError, "^choices must not be empty"),
        (lambda: support.check_tensor("x", torch.zeros(2), dims="1"), TypeError, "^dims must be an int"),
        (lambda: support.check_tensor("x", torch.zeros(2), min_dims=-1), ValueError, "^min_dims must be an integer >= 0"),
        (lambda: support.check_tensor("x", torch.zeros(2), floating=1), TypeError, "^floating must be True or False"),
        (lambda: support.check_tensor("x", torch.zeros(2), dtype="float32"), TypeError, "^dtype must be a torch.dtype"),
        (lambda: support.check_tensor("x", torch.zeros(2), sizes=[2]), TypeError, "^sizes must be a Mapping"),
        (lambda: support.check_type("x", 1, "int"), TypeError, "^expected must be a type or a non-empty tuple"),
        (lambda: support.check_int_sequence("ids", [1], maximum=-1, minimum=0), ValueError, "^maximum must be an integer >= 0"),
    ],
)
def test_the_checks_refuse_malformed_options_of_their_own(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --------------------------------------------------------------------------- figure style and data


def test_data_path_is_absolute_and_works_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # works from any working directory
    folder = support.data_path()
    assert folder.is_absolute() and folder.is_dir()
    assert (folder / "README.md").is_file()  # the file that records where each data file came from
    corpus = support.data_path("pride-and-prejudice-ch01-30.txt")
    assert corpus == folder / "pride-and-prejudice-ch01-30.txt" and corpus.is_file()
    assert support.data_path("configs", "gemma-3-1b.json") == support.data_path("configs/gemma-3-1b.json")


def test_apply_book_style_sets_palette_cycle():
    import matplotlib as mpl

    support.apply_book_style()
    colours = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    assert tuple(colours) == support.PALETTE
    assert mpl.rcParams["axes.grid"] is True


def test_data_path_names_what_exists_when_a_file_is_missing():
    with pytest.raises(ValueError, match=r"^data_path parts must name a file or folder among the book's data files"
                                         r".*; the data folder holds: README.md, configs/.*\(got 'no-such-file.txt'\)$"):
        support.data_path("no-such-file.txt")
    with pytest.raises(ValueError, match=r"; configs/ holds: .*llama-2-7b.json.* \(got 'configs/llama.json'\)$"):
        support.data_path("configs", "llama.json")


@pytest.mark.parametrize("part", ["..", "configs/../../README.md", "/etc/passwd", ""])
def test_data_path_refuses_paths_that_leave_the_data_folder(part):
    with pytest.raises(ValueError, match=r"^data_path parts must be non-empty relative paths that stay inside"):
        support.data_path(part)


@pytest.mark.parametrize("part", [3, None, b"configs"])
def test_data_path_refuses_parts_that_are_not_strings(part):
    with pytest.raises(TypeError, match=r"^data_path parts must be strings \(got "):
        support.data_path("configs", part)
