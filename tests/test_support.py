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
    for bad in (float("nan"), float("inf"), -float("inf"), np.float32("nan")):
        with pytest.raises(ValueError, match=r"^scale must be a finite number \(got "):
            support.check_number("scale", bad, minimum=0)


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
    with pytest.raises(TypeError, match=r"^model must be a torch\.nn\.Module \(got int 7\)$"):
        support.check_type("model", 7, torch.nn.Module)


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


def test_check_divides_names_both_counts():
    assert support.check_divides("heads", 4, "d_model", 32) == 4
    with pytest.raises(ValueError, match=r"^kv_heads must divide query_heads \(got kv_heads=5 and query_heads=32\)$"):
        support.check_divides("kv_heads", 5, "query_heads", 32)


def test_check_dtype_refuses_what_is_not_a_dtype():
    assert support.check_dtype("dtype", torch.bfloat16) is torch.bfloat16
    assert support.check_dtype("dtype", torch.int8) is torch.int8
    with pytest.raises(TypeError, match=r"^dtype must be a torch.dtype \(got str 'float32'\)$"):
        support.check_dtype("dtype", "float32")


@pytest.mark.parametrize(
    "bits, allowed, message",
    [
        (1, range(2, 17), r"^bits must be an integer from 2 to 16, a width the packer can hold \(got 1\)$"),
        (17, range(2, 17), r"^bits must be an integer from 2 to 16, a width the packer can hold \(got 17\)$"),
        (3, (4, 8), r"^bits must be one of 4, 8, a width the packer can hold \(got 3\)$"),
        (16, (4, 8, 32), r"^bits must be one of 4, 8, 32, a width the packer can hold \(got 16\)$"),
    ],
)
def test_check_bits_refuses_widths_the_packer_cannot_hold(bits, allowed, message):
    with pytest.raises(ValueError, match=message):
        support.check_bits("bits", bits, allowed)


def test_check_bits_accepts_the_packers_widths_as_ints_and_refuses_non_integers():
    assert support.check_bits("bits", np.int64(4), (4, 8)) == 4
    assert [support.check_bits("bits", b, range(2, 17)) for b in (2, 16)] == [2, 16]
    for bad in (4.0, True, "4"):
        with pytest.raises(TypeError, match="^bits must be an int"):
            support.check_bits("bits", bad, (4, 8))


def test_check_attention_inputs_returns_the_scores_shape():
    query, key, value = torch.zeros(2, 1, 3, 8), torch.zeros(1, 4, 5, 8), torch.zeros(1, 4, 5, 2)
    assert support.check_attention_inputs(query, key, value) == (2, 4, 3, 5)
    same = torch.zeros(2, 6, 8)
    assert support.check_attention_inputs(same, same, torch.zeros(2, 6, 3), same_tokens=True) == (2, 6, 6)


@pytest.mark.parametrize(
    "shapes, same_tokens, error, message",
    [
        (((3, 8), (5, 4), (5, 2)), False, ValueError, r"^query and key must share d, and key and value T_k \(got query \(3, 8\), key \(5, 4\), value \(5, 2\)\)$"),
        (((3, 8), (5, 8), (4, 2)), False, ValueError, "key and value T_k"),
        (((2, 3, 8), (3, 5, 8), (3, 5, 2)), False, ValueError, "^the leading dimensions of query, key and value must broadcast"),
        (((3, 8), (5, 8), (5, 2)), True, ValueError, r"^query and key must be \(\.\.\., T, d\) alike and value \(\.\.\., T, d_v\)"),
        (((8,), (5, 8), (5, 2)), False, ValueError, r"^query must have at least 2 dimensions \(got shape \(8,\)\)$"),
        (((3, 0), (5, 0), (5, 2)), False, ValueError, r"^query must not be empty"),
    ],
)
def test_check_attention_inputs_names_what_disagrees(shapes, same_tokens, error, message):
    tensors = [torch.zeros(*shape) for shape in shapes]
    with pytest.raises(error, match=message):
        support.check_attention_inputs(*tensors, same_tokens=same_tokens)


def test_check_attention_inputs_refuses_integer_tensors_and_mixed_dtypes():
    with pytest.raises(TypeError, match=r"^key must be a floating-point tensor \(got tensor of dtype torch.int64"):
        support.check_attention_inputs(torch.zeros(3, 8), torch.zeros(5, 8, dtype=torch.long), torch.zeros(5, 2))
    with pytest.raises(TypeError, match=r"^query, key and value must share one dtype \(got torch.float32, torch.float64 and"):
        support.check_attention_inputs(torch.zeros(3, 8), torch.zeros(5, 8).double(), torch.zeros(5, 2))
    with pytest.raises(TypeError, match=r"^value must be a floating-point tensor \(got list\)$"):
        support.check_attention_inputs(torch.zeros(3, 8), torch.zeros(5, 8), [[0.0, 0.0]])


def test_check_int_sequence_max_length_refuses_a_prompt_longer_than_the_context():
    assert support.check_int_sequence("prompt_ids", [1, 2, 3], max_length=3).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=r"prompt_ids must hold at most 3 entries \(got 4\)"):
        support.check_int_sequence("prompt_ids", [1, 2, 3, 4], max_length=3)


def test_check_int_sequence_min_length_refuses_a_text_too_short_for_a_window():
    assert support.check_int_sequence("token_ids", [1, 2, 3], min_length=3).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=r"^token_ids must hold at least 4 entries \(got 3\)$"):
        support.check_int_sequence("token_ids", [1, 2, 3], min_length=4)


def test_check_int_optional_passes_none_through_and_checks_everything_else():
    assert support.check_int("window", None, minimum=1, optional=True) is None
    assert support.check_int("window", np.int32(4), minimum=1, optional=True) == 4
    with pytest.raises(ValueError, match=r"^window must be a positive integer \(got 0\)$"):
        support.check_int("window", 0, minimum=1, optional=True)
    with pytest.raises(TypeError, match=r"^window must be an int \(got NoneType\)$"):
        support.check_int("window", None, minimum=1)


def test_check_number_choice_and_type_pass_none_only_when_optional():
    assert support.check_number("mscale", None, above=0, optional=True) is None
    assert support.check_choice("torch_dtype", None, ("float16",), optional=True) is None
    assert support.check_type("rope_scaling", None, dict, optional=True) is None
    assert support.check_number("mscale", np.float64(0.7), above=0, optional=True) == 0.7
    with pytest.raises(ValueError, match=r"^mscale must be > 0 \(got 0\)$"):
        support.check_number("mscale", 0, above=0, optional=True)
    with pytest.raises(ValueError, match=r"^torch_dtype must be one of 'float16' \(got 'int3'\)$"):
        support.check_choice("torch_dtype", "int3", ("float16",), optional=True)
    with pytest.raises(TypeError, match=r"^rope_scaling must be a dict \(got str 'yarn'\)$"):
        support.check_type("rope_scaling", "yarn", dict, optional=True)
    with pytest.raises(TypeError, match=r"^mscale must be a real number \(got NoneType\)$"):
        support.check_number("mscale", None, above=0)
    with pytest.raises(TypeError, match=r"^torch_dtype must be one of 'float16' \(got NoneType\)$"):
        support.check_choice("torch_dtype", None, ("float16",))
    with pytest.raises(TypeError, match=r"^rope_scaling must be a dict \(got NoneType\)$"):
        support.check_type("rope_scaling", None, dict)


def test_config_value_reads_a_field_a_default_or_names_the_mapping_that_lacks_it():
    config = {"num_hidden_layers": 32, "head_dim": None, "bias": False}
    assert support.config_value(config, "num_hidden_layers") == 32
    assert support.config_value(config, "bias") is False  # a falsy value is present
    assert support.config_value(config, "bias", True) is False
    for key in ("head_dim", "hidden_size"):  # null and absent alike: the default, or refused
        assert support.config_value(config, key, 128) == 128
        with pytest.raises(ValueError, match=rf"^config is missing required field '{key}'$"):
            support.config_value(config, key)
    with pytest.raises(ValueError, match=r"^rope_scaling is missing required field 'factor'$"):
        support.config_value({}, "factor", source="rope_scaling")


def test_the_check_language_is_gone():
    """Checks are plain functions: no Field tables, no check_fields or check_arguments."""
    for name in ("Field", "REQUIRED", "COUNT", "SIZE", "SEED", "FLAG", "POSITIVE", "check_fields",
                 "check_arguments"):
        assert not hasattr(support, name), name


def test_the_checks_module_has_one_helper_per_kind_and_no_self_checks():
    """The checks trust their own options (the book's code writes them); each is a few lines."""
    import ast
    import inspect

    from longctx.support import checks

    tree = ast.parse(inspect.getsource(checks))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    public = sorted(name for name in functions if name.startswith("check_"))
    assert public == sorted(name for name in support.__all__ if name.startswith("check_"))
    for name in public:
        body = functions[name].body[1:]  # without the docstring
        statements = sum(1 for node in body for _ in ast.walk(node) if isinstance(_, ast.stmt))
        assert statements <= 24, f"{name} has {statements} statements"
        calls_itself = [n for node in body for n in ast.walk(node)
                        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]
        assert not calls_itself, f"{name} checks its own options"


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
    with pytest.raises(TypeError, match=r"^data_path parts must be a str \(got "):
        support.data_path("configs", part)


# --- the figures' text watch ----------------------------------------------------------------------


def _drawn_warnings(fig) -> list[str]:
    import io
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(io.BytesIO(), bbox_inches="tight")  # as the notebook and Quarto draw it
    return sorted({str(w.message) for w in caught if issubclass(w.category, support.style.FigureTextWarning)})


def test_the_book_style_warns_of_overlapping_crowded_and_cut_off_text_and_nothing_else():
    import warnings

    from matplotlib import pyplot as plt

    plt.switch_backend("Agg")  # no display: draw into memory
    support.apply_book_style()
    try:
        clean, ax = plt.subplots()
        ax.plot([1, 2], [3, 4], label="a line")
        ax.set(title="a title", xlabel="x", ylabel="y")
        ax.legend()
        ax.annotate("a note", (1.2, 3.6))
        assert _drawn_warnings(clean) == [] and support.style.text_problems(clean) == []
        crowded, ax = plt.subplots()
        ax.plot([0, 1])
        ax.text(0.5, 0.5, "first label")
        ax.text(0.52, 0.5, "second label")
        ax.text(0.97, 0.2, "a label past the edge", clip_on=True)
        assert _drawn_warnings(crowded) == [
            "figure text: 'a label past the edge' is cut off at its axes' edge",
            "figure text: 'first label' overlaps 'second label'"]
        ticks, ax = plt.subplots()
        ax.plot(range(60))
        ax.set_xticks(range(60))  # sixty labels along one axis cannot all be read
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", support.style.FigureTextWarning)  # the watch says it too
            assert any("overlaps" in problem for problem in support.style.text_problems(ticks))
        named, ax = plt.subplots()
        ax.scatter([1, 1.05, 2], [1, 1, 1])
        labels = [ax.annotate(name, (x, 1), xytext=(4, 2), textcoords="offset points")
                  for name, x in (("first point", 1), ("second point", 1.05), ("third", 2))]
        assert support.style.text_problems(named)  # the first two names collide
        support.style.spread_labels(named, labels)
        assert support.style.text_problems(named) == [] and labels[2].xyann == (4, 2)  # only the crowd moved
    finally:
        plt.close("all")
