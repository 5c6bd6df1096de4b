# Generated from chapters/ch03-long-context.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
# ruff: noqa: E402, F811, I001
"""Code saved from chapters/ch03-long-context.qmd ("Attention, Position, and Long Context")."""


# chapters/ch03-long-context.qmd:93
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longctx import ch01, support

#: Bytes per number for the ``torch_dtype`` strings found in config.json files.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


def _positive_int(value: Any, what: str) -> int:
    """Return ``value`` if it is a positive int, else raise ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer (got {value!r})")
    return value


@dataclass(frozen=True)
class KVConfig:
    """The architectural numbers that fix how many bytes a KV cache holds.

    Every field is a factor of @eq-ch03-kvbytes. A standard layer caches
    ``2 * kv_heads * head_dim`` numbers per token, one key and one value per KV
    head; a latent layer caches ``latent_rank + rope_key_dim`` numbers instead.
    ``windowed_layers`` of the ``layers`` keep only their last ``window`` tokens.

    Args:
        name: Label used in tables and plots.
        layers: Attention layers, L.
        query_heads: Query heads, H_q. They do not enter the byte count; they
            are kept so the ratio H_kv / H_q can be read off.
        head_dim: Width of one head, d_h.
        bytes_per_scalar: Bytes per stored number, s (2 for bf16 or fp16).
        kv_heads: Key-value heads, H_kv, for a standard cache; None for a latent one.
        latent_rank: Width r of the cached latent (MLA); None for a standard cache.
        rope_key_dim: Width d_R of a decoupled rotary key cached beside the latent.
        window: Width W of the sliding window of the windowed layers, or None.
        windowed_layers: How many of the layers use that window (0 for none).

    Raises:
        ValueError: If a count is not a positive integer, if both or neither of
            ``kv_heads`` and ``latent_rank`` are given, if ``kv_heads`` does not
            divide ``query_heads``, or if the window fields contradict each other.
    """

    name: str                        # label
    layers: int                      # L
    query_heads: int                 # H_q
    head_dim: int                    # d_h
    bytes_per_scalar: int            # s
    kv_heads: int | None = None      # H_kv (standard cache)
    latent_rank: int | None = None   # r (latent cache)
    rope_key_dim: int = 0            # d_R (latent cache)
    window: int | None = None        # W
    windowed_layers: int = 0         # layers that keep only W tokens

    def __post_init__(self) -> None:
        for field_name in ("layers", "query_heads", "head_dim", "bytes_per_scalar"):
            _positive_int(getattr(self, field_name), field_name)
        if (self.kv_heads is None) == (self.latent_rank is None):
            raise ValueError("give exactly one of kv_heads (standard cache) and latent_rank (latent cache)")
        if self.kv_heads is not None:
            _positive_int(self.kv_heads, "kv_heads")
            if self.query_heads % self.kv_heads:
                raise ValueError(f"kv_heads must divide query_heads (got {self.query_heads} and {self.kv_heads})")
        else:
            _positive_int(self.latent_rank, "latent_rank")
        if isinstance(self.rope_key_dim, bool) or not isinstance(self.rope_key_dim, int) or self.rope_key_dim < 0:
            raise ValueError(f"rope_key_dim must be a non-negative integer (got {self.rope_key_dim!r})")
        if isinstance(self.windowed_layers, bool) or not isinstance(self.windowed_layers, int) \
                or not 0 <= self.windowed_layers <= self.layers:
            raise ValueError(f"windowed_layers must be an integer in 0..{self.layers} (got {self.windowed_layers!r})")
        if self.window is not None:
            _positive_int(self.window, "window")
        elif self.windowed_layers:
            raise ValueError("windowed_layers > 0 needs a window width")

    def cached_scalars_per_layer_token(self) -> int:
        """Return how many numbers one layer stores per token: 2*H_kv*d_h, or r + d_R for a latent cache."""
        if self.latent_rank is None:
            return 2 * self.kv_heads * self.head_dim      # one key and one value per KV head
        return self.latent_rank + self.rope_key_dim

    @classmethod
    def from_hf_config(cls, mapping: Mapping[str, Any], *, name: str | None = None,
                       bytes_per_scalar: int | None = None) -> "KVConfig":
        """Return the KVConfig that a Hugging Face ``config.json`` mapping describes.

        Fields read: ``num_hidden_layers``, ``num_attention_heads``,
        ``num_key_value_heads`` (absent means one per query head, as in
        transformers), ``head_dim`` (else ``hidden_size // num_attention_heads``),
        ``torch_dtype`` (or ``dtype``), ``kv_lora_rank`` and ``qk_rope_head_dim``
        for a latent cache, and ``sliding_window``. Which layers use the window
        comes from ``layer_types``, else ``sliding_window_pattern`` (every p-th
        layer global), else every layer (the Mistral convention; ``model_type``
        ``gemma2`` alternates). ``use_sliding_window: false`` turns the window
        off. A nested ``text_config`` is read in place of the outer mapping.

        Args:
            mapping: The parsed config.json.
            name: Label; defaults to the ``_source`` field or ``model_type``.
            bytes_per_scalar: Cache width s; defaults to the width of torch_dtype.

        Returns:
            The matching KVConfig.

        Raises:
            TypeError: If ``mapping`` is not a mapping.
            ValueError: If a required field is missing or unusable.
        """
        if not isinstance(mapping, Mapping):
            raise TypeError(f"mapping must be a dict-like config (got {type(mapping).__name__})")
        if isinstance(mapping.get("text_config"), Mapping):
            mapping = {**mapping, **mapping["text_config"]}

        def need(key: str) -> Any:
            if mapping.get(key) is None:
                raise ValueError(f"config is missing required field {key!r}")
            return mapping[key]

        layers = _positive_int(need("num_hidden_layers"), "num_hidden_layers")
        query_heads = _positive_int(need("num_attention_heads"), "num_attention_heads")
        if mapping.get("head_dim") is not None:
            head_dim = mapping["head_dim"]
        else:
            head_dim = _positive_int(need("hidden_size"), "hidden_size") // query_heads
        if bytes_per_scalar is None:
            dtype = mapping.get("torch_dtype", mapping.get("dtype"))
            if dtype is None:
                raise ValueError("config is missing required field 'torch_dtype' (or pass bytes_per_scalar)")
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"unknown torch_dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
            bytes_per_scalar = DTYPE_BYTES[dtype]
        window, windowed = mapping.get("sliding_window"), 0
        if mapping.get("use_sliding_window") is False:
            window = None
        if window is not None:
            if isinstance(mapping.get("layer_types"), list):
                windowed = sum(kind == "sliding_attention" for kind in mapping["layer_types"])
            else:
                pattern = mapping.get("sliding_window_pattern")
                if pattern is None and mapping.get("model_type") == "gemma2":
                    pattern = 2
                windowed = layers if pattern is None else layers - layers // pattern
            if windowed == 0:
                window = None
        label = name or mapping.get("_source") or mapping.get("model_type") or "unnamed"
        common = dict(name=label, layers=layers, query_heads=query_heads, head_dim=head_dim,
                      bytes_per_scalar=bytes_per_scalar, window=window, windowed_layers=windowed)
        if mapping.get("kv_lora_rank") is not None:
            return cls(latent_rank=mapping["kv_lora_rank"], rope_key_dim=mapping.get("qk_rope_head_dim") or 0,
                       **common)
        return cls(kv_heads=mapping.get("num_key_value_heads") or query_heads, **common)


def kv_bytes(config: KVConfig, tokens: int, batch: int = 1) -> int:
    """Payload bytes of an append-only, unquantized KV cache, by @eq-ch03-kvbytes.

    Global layers keep all ``tokens``; windowed layers keep ``min(tokens, window)``.
    This is tensor payload only: allocator padding, attention workspaces and
    copies made by tensor parallelism come on top.

    Args:
        config: The cache architecture.
        tokens: Tokens kept per sequence, T (>= 0).
        batch: Sequences cached at once, B (>= 1).

    Returns:
        The number of bytes.

    Raises:
        ValueError: For negative ``tokens`` or a ``batch`` below 1.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative integer (got {tokens!r})")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer (got {batch!r})")
    kept = (config.layers - config.windowed_layers) * tokens          # global layers: T each
    if config.windowed_layers:
        kept += config.windowed_layers * min(tokens, config.window)   # windowed layers: min(T, W)
    return batch * kept * config.cached_scalars_per_layer_token() * config.bytes_per_scalar


# chapters/ch03-long-context.qmd:348
def load_model_config(name: str) -> dict[str, Any]:
    """Return the shipped config.json excerpt ``data/configs/<name>.json`` as a dict.

    Args:
        name: File stem, for example ``"llama-3.1-8b"``.

    Raises:
        ValueError: If no excerpt of that name is shipped (the message lists those that are).
    """
    folder = support.data_path("configs")
    shipped = sorted(path.stem for path in folder.glob("*.json"))
    if name not in shipped:
        raise ValueError(f"no shipped model config named {name!r}; shipped: {shipped}")
    with (folder / f"{name}.json").open(encoding="utf-8") as handle:
        return json.load(handle)


#: The config excerpts shipped in data/configs/, in the order the chapter uses them.
MODEL_CONFIG_NAMES = ("llama-2-7b", "llama-3.1-8b", "deepseek-v2-lite", "mistral-7b-v0.1", "gemma-3-1b")


# chapters/ch03-long-context.qmd:504
import torch
from torch import Tensor, nn

from longctx.support import check_int, check_number


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Return (B, H_kv*groups, T, d_h): each KV head copied for every query head of its group.

    Query head ``h`` reads KV head ``h // groups`` (@eq-ch03-gqa-ratio). The
    copy is materialized; ``grouped_attention`` avoids it.

    Raises:
        ValueError: If ``groups`` is not a positive integer or ``x`` is not 4-D.
    """
    _positive_int(groups, "groups")
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, H_kv, T, d_h) (got {tuple(x.shape)})")
    batch, kv_heads, length, width = x.shape
    return x[:, :, None].expand(batch, kv_heads, groups, length, width).reshape(batch, kv_heads * groups, length, width)


def grouped_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
    """Return grouped-query attention, (B, H_q, T_q, d_v), without copying KV heads.

    Args:
        query: (B, H_q, T_q, d_h).
        key: (B, H_kv, T_k, d_h) with H_kv dividing H_q.
        value: (B, H_kv, T_k, d_v).
        mask: Optional bool mask broadcastable to (B, H_q, T_q, T_k); True = may attend.

    Raises:
        ValueError: If a tensor is not 4-D or the head counts do not divide.
    """
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("query, key and value must be 4-D: (B, heads, T, d_h)")
    batch, query_heads, query_len, width = query.shape
    kv_heads, key_len = key.size(1), key.size(2)
    if value.size(1) != kv_heads or query_heads % kv_heads:
        raise ValueError(f"key/value heads must divide query heads (got {query_heads} and {kv_heads})")
    groups = query_heads // kv_heads
    # The g query heads of a group become g * T_q rows over one KV head: a view, since head h = kv * g + j.
    # (Giving key a size-1 group axis and broadcasting looks equivalent, but torch.matmul then expands
    # and flattens the key, which copies it once per query head.)
    q = query.reshape(batch, kv_heads, groups * query_len, width)   # (B, H_kv, g*T_q, d_h)
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B or 1, H_q or 1, T_q, T_k)
        if mask.size(1) == 1:       # one mask for every head: stack it once per query head of a group
            mask = mask.repeat(1, 1, groups, 1)                      # (B or 1, 1, g*T_q, T_k)
        else:                       # a mask per query head: the same view as the queries
            mask = mask.reshape(mask.size(0), kv_heads, groups * query_len, key_len)
    out, _ = ch01.scaled_dot_product_attention(q, key, value, mask)  # (B, H_kv, g*T_q, d_v), key read once
    return out.reshape(batch, query_heads, query_len, value.size(-1))


#: A layer's cache: (keys, values), each (B, H_kv, T, d_h).
KVPair = tuple[Tensor, Tensor]


def decode_token_by_token(layer: nn.Module, x: Tensor) -> Tensor:
    """Outputs (B, T, d_model) of ``layer`` fed one token of ``x`` at a time through its own cache.

    ``layer(x, cache) -> (output, cache)`` is the protocol of this chapter's
    attention layers; comparing the result with ``layer(x)[0]`` checks that
    cached decoding computes the same function as a full pass.
    """
    outputs, state = [], None
    for position in range(x.shape[1]):
        out, state = layer(x[:, position:position + 1], state)
        outputs.append(out)
    return torch.cat(outputs, dim=1)


def causal_rows(query_len: int, key_len: int, *, device: torch.device | str | None = None) -> Tensor:
    """Return the rows of the causal mask that the last ``query_len`` of ``key_len`` tokens need.

    A bool (query_len, key_len) tensor, True where query i (at position
    key_len - query_len + i) may read key j. A decode step (query_len 1)
    builds one row of T entries, never the T x T mask.

    Raises:
        TypeError: If a length is not an int.
        ValueError: If a length is not positive or query_len > key_len.
    """
    query_len = check_int("query_len", query_len, minimum=1)
    key_len = check_int("key_len", key_len, minimum=query_len)
    query_at = torch.arange(key_len - query_len, key_len, device=device)[:, None]  # (T_q, 1)
    return torch.arange(key_len, device=device)[None, :] <= query_at              # (T_q, T_k)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention whose ``kv_heads`` dial spans MHA, GQA and MQA.

    ``query_heads`` query heads share ``kv_heads`` key-value heads, and only the
    ``kv_heads`` heads are cached, so the cache shrinks by ``kv_heads / query_heads``
    (@eq-ch03-gqa-ratio) while the output shape stays the same.

    Args:
        d_model: Model width.
        query_heads: Query heads; must divide ``d_model``.
        kv_heads: Key-value heads; must divide ``query_heads``.

    Raises:
        ValueError: If a count is not positive or a divisibility condition fails.
    """

    def __init__(self, d_model: int, query_heads: int, kv_heads: int):
        for count, what in ((d_model, "d_model"), (query_heads, "query_heads"), (kv_heads, "kv_heads")):
            _positive_int(count, what)
        if d_model % query_heads:
            raise ValueError(f"query_heads must divide d_model (got {d_model} and {query_heads})")
        if query_heads % kv_heads:
            raise ValueError(f"kv_heads must divide query_heads (got {query_heads} and {kv_heads})")
        super().__init__()
        self.d_model, self.query_heads, self.kv_heads = d_model, query_heads, kv_heads
        self.head_dim = d_model // query_heads
        kv_width = kv_heads * self.head_dim                       # H_kv * d_h: all that is cached per token
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.output = nn.Linear(d_model, d_model, bias=False)
        self.key = nn.Linear(d_model, kv_width, bias=False)
        self.value = nn.Linear(d_model, kv_width, bias=False)

    def forward(self, x: Tensor, cache: KVPair | None = None) -> tuple[Tensor, KVPair]:
        """Return (output (B, T, d_model), cache) for new tokens ``x`` (B, T, d_model).

        ``cache`` is the (keys, values) pair returned by the previous call, each
        (B, kv_heads, T_past, d_h); the returned pair has the new tokens appended.

        Raises:
            ValueError: If ``x`` is not (B, T, d_model).
        """
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"x must have shape (B, T, {self.d_model}) (got {tuple(x.shape)})")
        q = ch01.split_heads(self.query(x), self.query_heads)    # (B, H_q, T, d_h)
        k = ch01.split_heads(self.key(x), self.kv_heads)         # (B, H_kv, T, d_h)
        v = ch01.split_heads(self.value(x), self.kv_heads)       # (B, H_kv, T, d_h)
        if cache is not None:
            past_keys, past_values = cache
            k = torch.cat([past_keys, k], dim=2)                 # (B, H_kv, T_past + T, d_h)
            v = torch.cat([past_values, v], dim=2)
        out = grouped_attention(q, k, v, causal_rows(x.size(1), k.size(2), device=x.device))
        return self.output(ch01.merge_heads(out)), (k, v)


# chapters/ch03-long-context.qmd:800
class ToyLatentKVAttention(nn.Module):
    """Causal attention that caches one low-rank latent per token, MLA-style (@eq-ch03-latent).

    ``latent_down`` maps each token to a rank-``latent_rank`` latent, which is
    all that is cached; ``key_up`` and ``value_up`` rebuild per-head keys and
    values from it at read time. With ``rope_key_dim > 0`` a decoupled rotary
    key (``rope_key``, shared by all heads) is rotated with ``apply_rope`` and
    cached beside the latent, and each head gets a rotary query part
    (``rope_query``). The up-projections are not absorbed.

    Args:
        d_model: Model width.
        query_heads: Heads; must divide ``d_model``.
        latent_rank: Cached latent width r.
        rope_key_dim: Width d_R of the decoupled rotary key (0 or even).
        rope_base: Base b of the rotary key's bands (> 1).

    Raises:
        ValueError: If a size is not positive, heads do not divide the width,
            or ``rope_key_dim`` is negative or odd.
    """

    def __init__(self, d_model: int, query_heads: int, latent_rank: int,  # r
                 rope_key_dim: int = 0,                                   # d_R; 0 = no rotary key
                 rope_base: float = 10_000.0):                            # b of the rotary key
        for count, what in ((d_model, "d_model"), (query_heads, "query_heads"), (latent_rank, "latent_rank")):
            _positive_int(count, what)
        if d_model % query_heads:
            raise ValueError(f"query_heads must divide d_model (got {d_model} and {query_heads})")
        if isinstance(rope_key_dim, bool) or not isinstance(rope_key_dim, int) or rope_key_dim < 0 or rope_key_dim % 2:
            raise ValueError(f"rope_key_dim must be 0 or a positive even integer (got {rope_key_dim!r})")
        super().__init__()
        self.d_model, self.query_heads, self.head_dim = d_model, query_heads, d_model // query_heads
        self.rope_key_dim = rope_key_dim                              # d_R
        self.rope_base = check_number("rope_base", rope_base, above=1)  # b
        self.latent_rank = latent_rank                                # r
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.latent_down = nn.Linear(d_model, latent_rank, bias=False)
        self.key_up = nn.Linear(latent_rank, d_model, bias=False)
        self.value_up = nn.Linear(latent_rank, d_model, bias=False)
        self.output = nn.Linear(d_model, d_model, bias=False)
        if rope_key_dim:
            self.rope_query = nn.Linear(d_model, query_heads * rope_key_dim, bias=False)
            self.rope_key = nn.Linear(d_model, rope_key_dim, bias=False)

    def latent_width(self) -> int:
        """Return the numbers cached per token, r + d_R (@eq-ch03-kvbytes's width for a latent cache)."""
        return self.latent_rank + self.rope_key_dim

    def forward(self, x: Tensor, cache: Tensor | None = None, *, start: int | None = None) -> tuple[Tensor, Tensor]:
        """Return (output (B, T, d_model), cache (B, T_past + T, r + d_R)) for new tokens ``x``.

        Args:
            x: New tokens, (B, T, d_model).
            cache: The latent returned by the previous call, or None.
            start: Position of the first new token for the rotary key; defaults
                to the cache length (the only correct value; exposed so an
                exercise can break it).

        Raises:
            ValueError: If ``x`` or ``cache`` has the wrong shape.
        """
        latent, positions = self.extend_latent(x, cache, start=start)      # (B, T_k, r + d_R), (T,)
        content = latent[..., :self.latent_rank]
        q = ch01.split_heads(self.query(x), self.query_heads)                 # (B, H, T, d_h)
        k = ch01.split_heads(self.key_up(content), self.query_heads)          # (B, H, T_k, d_h), rebuilt
        v = ch01.split_heads(self.value_up(content), self.query_heads)        # (B, H, T_k, d_h), rebuilt
        if self.rope_key_dim:
            q_rot = self.rotary_queries(x, positions)                         # (B, H, T, d_R)
            k_rot = latent[:, None, :, self.latent_rank:].expand(-1, self.query_heads, -1, -1)
            q, k = torch.cat((q, q_rot), dim=-1), torch.cat((k, k_rot), dim=-1)  # content + rotary score terms
        visible = causal_rows(x.size(1), latent.size(1), device=x.device)    # (T, T_k)
        out, _ = ch01.scaled_dot_product_attention(q, k, v, visible)
        return self.output(ch01.merge_heads(out)), latent

    def rotary_bands(self) -> Tensor:
        """Return the decoupled rotary key's band frequencies, rope_base^(-2j/d_R), (d_R/2,) float64."""
        exponents = torch.arange(0, self.rope_key_dim, 2, dtype=torch.float64) / self.rope_key_dim
        return self.rope_base ** -exponents

    def extend_latent(self, x: Tensor, cache: Tensor | None = None, *,
                      start: int | None = None) -> tuple[Tensor, Tensor]:
        """Return (latent, positions): the cache with ``x``'s tokens appended, and their positions.

        The new tokens' latents (and, with ``rope_key_dim > 0``, their rotated
        rotary keys) are appended to ``cache``: (B, T_past + T, r + d_R).
        ``positions`` (T,) are the new tokens' positions, from ``start`` or the
        cache length. Every forward pass of a latent layer begins here.

        Raises:
            ValueError: If ``x`` or ``cache`` has the wrong shape.
        """
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"x must have shape (B, T, {self.d_model}) (got {tuple(x.shape)})")
        if cache is not None and (cache.dim() != 3 or cache.size(-1) != self.latent_width()):
            raise ValueError(f"cache must have shape (B, T_past, {self.latent_width()}) (got {tuple(cache.shape)})")
        past = 0 if cache is None else cache.size(1)
        positions = torch.arange(x.size(1), device=x.device) + (past if start is None else start)
        fresh = self.latent_down(x)                                           # (B, T, r)
        if self.rope_key_dim:
            rotated = apply_rope(self.rope_key(x), positions, self.rotary_bands())  # (B, T, d_R)
            fresh = torch.cat((fresh, rotated), dim=-1)                       # (B, T, r + d_R)
        latent = fresh if cache is None else torch.cat((cache, fresh), dim=1)  # (B, T_k, r + d_R)
        return latent, positions

    def rotary_queries(self, x: Tensor, positions: Tensor) -> Tensor:
        """Return each head's rotated rotary query part, (B, H, T, d_R), for tokens ``x`` at ``positions``."""
        per_head = ch01.split_heads(self.rope_query(x), self.query_heads)     # (B, H, T, d_R)
        return apply_rope(per_head, positions, self.rotary_bands())


# chapters/ch03-long-context.qmd:968
def visibility_mask(seq_len: int,               # T
                    window: int | None = None,  # W; None = full causal
                    sinks: int = 0, *,
                    query_len: int | None = None,
                    device: torch.device | str | None = None) -> Tensor:
    """Boolean grid, True where a query row may read a key column.

    ``window=None`` gives the causal mask. A finite ``window`` W keeps, for
    the query at position i, the keys j with i - W < j <= i; ``sinks`` keeps
    the first ``sinks`` positions visible as well (the StreamingLLM pattern).
    With ``query_len`` only the rows of the last ``query_len`` positions are
    built, (query_len, seq_len): what a decode step needs, O(T) not O(T^2).

    Args:
        seq_len: Sequence length, the number of keys (>= 1).
        window: Sliding-window width W (>= 1), or None for full causal attention.
        sinks: Initial positions that stay visible (>= 0; used only with a window).
        query_len: Rows to build, for the last positions (1..seq_len); None
            means every row, a (seq_len, seq_len) grid.
        device: Where to build the mask (default: the CPU).

    Raises:
        TypeError: If a count is not an int.
        ValueError: If an argument is out of range.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    if window is not None:
        window = check_int("window", window, minimum=1)
    sinks = check_int("sinks", sinks, minimum=0)
    rows = seq_len if query_len is None else check_int(
        "query_len", query_len, minimum=1, maximum=seq_len)
    visible = causal_rows(rows, seq_len, device=device)           # (T_q, T)
    if window is None:
        return visible
    query = torch.arange(seq_len - visible.size(0), seq_len, device=device)[:, None]
    key = torch.arange(seq_len, device=device)[None, :]
    return visible & ((query - key < window) | (key < sinks))


# chapters/ch03-long-context.qmd:1220
def apply_rope(vectors: Tensor, positions: Tensor | list[int], frequencies: Tensor, magnitude: float = 1.0) -> Tensor:
    """Rotated copy of ``vectors``: pair (2j, 2j+1) of row t turned by positions[t] * frequencies[j] (@eq-ch03-rope).

    The rotation keeps norms, and a query rotated at m and a key rotated at n
    have a dot product that depends only on n - m (@eq-ch03-rope-relative).
    Angles are computed in float64 and the result has the dtype of ``vectors``.

    Args:
        vectors: (..., T, d_R) queries or keys, d_R even.
        positions: (T,) integer positions, one per row.
        frequencies: (d_R / 2,) band frequencies, e.g. from ``inverse_frequencies``.
        magnitude: Factor applied to the result (YaRN's attention factor; 1 keeps norms).

    Raises:
        ValueError: If d_R is odd, the frequency count is not d_R / 2, or the
            position count is not T.
    """
    width = vectors.size(-1)
    if width % 2:
        raise ValueError(f"the rotary dimension must be even (got {width})")
    if frequencies.dim() != 1 or 2 * frequencies.numel() != width:
        raise ValueError(f"need {width // 2} frequencies for width {width} (got shape {tuple(frequencies.shape)})")
    positions = torch.as_tensor(positions)
    if vectors.dim() < 2 or positions.dim() != 1 or positions.numel() != vectors.size(-2):
        raise ValueError(f"need one position per row: {vectors.size(-2) if vectors.dim() > 1 else 'a (T, d) input'} "
                         f"(got positions of shape {tuple(positions.shape)})")
    angles = positions.to(frequencies.device, torch.float64)[:, None] * frequencies.to(torch.float64)  # m * omega_j
    cos = angles.cos().to(vectors.device, vectors.dtype)                               # (T, d_R/2)
    sin = angles.sin().to(vectors.device, vectors.dtype)
    x_even, x_odd = vectors[..., 0::2], vectors[..., 1::2]                             # x_{2j}, x_{2j+1}
    new_even = x_even * cos - x_odd * sin                                              # first row of R_j(m)
    new_odd = x_even * sin + x_odd * cos                                               # second row of R_j(m)
    turned = torch.stack([new_even, new_odd], dim=-1)                                  # re-interleave the pairs
    return turned.flatten(-2) * magnitude


# chapters/ch03-long-context.qmd:1307
def apply_rope_rotate_half(vectors: Tensor, positions: Tensor, frequencies: Tensor,
                           magnitude: float = 1.0) -> Tensor:
    """Return ``vectors`` rotated in the rotate-half layout: coordinate j pairs with j + d_R/2.

    This is the layout of Hugging Face's Llama code; it equals ``apply_rope`` on
    coordinates permuted by ``interleaved_to_half_order``.

    Raises:
        ValueError: On the same bad inputs as ``apply_rope``.
    """
    order = interleaved_to_half_order(vectors.size(-1))
    inverse = torch.argsort(order)
    # Undo the permutation, rotate in the interleaved layout, permute back.
    return apply_rope(vectors[..., inverse], positions, frequencies, magnitude)[..., order]


def interleaved_to_half_order(width: int) -> Tensor:
    """Return the index order (0, 2, 4, ..., 1, 3, 5, ...) that maps the interleaved layout to rotate-half.

    Raises:
        ValueError: If ``width`` is not a positive even integer.
    """
    _positive_int(width, "width")
    if width % 2:
        raise ValueError(f"width must be even (got {width})")
    return torch.cat((torch.arange(0, width, 2), torch.arange(1, width, 2)))


# chapters/ch03-long-context.qmd:1492
#: The RoPE construction names ``inverse_frequencies`` understands.
ROPE_METHODS = ("rope", "pi", "ntk", "yarn")


def _check_rope_args(dim: int, base: float, factor: float) -> None:
    """Raise ValueError unless dim is an even integer >= 4, base > 1 and factor >= 1."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim % 2 or dim < 4:
        raise ValueError(f"rotary dim must be an even integer >= 4 (got {dim!r})")
    if not base > 1:
        raise ValueError(f"base must be greater than 1 (got {base!r})")
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1 (got {factor!r})")


def ntk_base(base: float, factor: float, dim: int) -> float:
    """Raised base b' = b * a^(d_R / (d_R - 2)) of NTK-aware scaling (@eq-ch03-ntk).

    Args:
        base: Original base b (> 1).
        factor: Extension factor a (>= 1).
        dim: Rotary width d_R (even, >= 4).

    Raises:
        ValueError: If dim is odd or below 4, base <= 1, or factor < 1.
    """
    _check_rope_args(dim, base, factor)
    return base * factor ** (dim / (dim - 2))


def yarn_correction_dim(turns: float, dim: int, base: float, original_context: int) -> float:
    """Return the (fractional) band index j(beta) that turns ``turns`` times within T_0 (@eq-ch03-yarn)."""
    return dim * math.log(original_context / (turns * 2 * math.pi)) / (2 * math.log(base))


def inverse_frequencies(dim: int,                # d_R, even
                        *,
                        method: str = "rope",           # one of ROPE_METHODS
                        base: float = 10_000.0,         # b
                        factor: float = 1.0,            # a = T_1 / T_0
                        original_context: int = 2_048,  # T_0, used by YaRN
                        beta_fast: float = 32.0,        # YaRN: keep bands turning more often than this
                        beta_slow: float = 1.0,         # YaRN: interpolate bands turning less often
                        ) -> tuple[Tensor, float]:
    """Band frequencies (dim/2,) in float64 and a magnitude, for one RoPE construction.

    ``rope``: omega_j = base^(-2j/dim) (@eq-ch03-rope). ``pi``: all bands / factor.
    ``ntk``: the bands of ``ntk_base`` (@eq-ch03-ntk). ``yarn``: the ramp blend
    of @eq-ch03-yarn, with magnitude 0.1 ln(factor) + 1; every other method
    returns magnitude 1.

    Args:
        dim: Rotary width d_R (even, >= 4).
        method: One of ``ROPE_METHODS``.
        base: Base b (> 1).
        factor: Extension factor a (>= 1).
        original_context: Trained length T_0 (YaRN only).
        beta_fast: Turns within T_0 above which YaRN keeps a band (YaRN only).
        beta_slow: Turns within T_0 below which YaRN interpolates a band (YaRN only).

    Raises:
        ValueError: If dim, base or factor is out of range, the method is
            unknown, or (YaRN) original_context or the betas are unusable.
    """
    _check_rope_args(dim, base, factor)
    if method not in ROPE_METHODS:
        raise ValueError(f"unknown RoPE method {method!r}; choose one of {ROPE_METHODS}")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim           # 2j / d_R
    plain = base ** -exponents                                               # omega_j
    if method == "rope":
        return plain, 1.0
    if method == "pi":
        return plain / factor, 1.0
    if method == "ntk":
        return ntk_base(base, factor, dim) ** -exponents, 1.0
    _positive_int(original_context, "original_context")
    if not beta_fast > beta_slow > 0:
        raise ValueError(f"need beta_fast > beta_slow > 0 (got {beta_fast} and {beta_slow})")
    low = max(math.floor(yarn_correction_dim(beta_fast, dim, base, original_context)), 0)
    high = min(math.ceil(yarn_correction_dim(beta_slow, dim, base, original_context)), dim - 1)
    if low == high:
        high += 0.001                                          # avoid dividing by zero, as the reference does
    band_index = torch.arange(dim // 2, dtype=torch.float64)                 # j
    ramp = torch.clamp((band_index - low) / (high - low), 0.0, 1.0)          # gamma_j
    magnitude = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return plain * (1 - ramp) + (plain / factor) * ramp, magnitude


# chapters/ch03-long-context.qmd:1787
def retrieval_probe(method: str | tuple[Tensor, float], *,
                    seed: int = 1_700,          # one generator feeds every draw
                    trials: int = 256,          # per depth
                    context: int = 128,         # T_1
                    original_context: int = 32,  # T_0; factor = T_1 / T_0
                    dim: int = 32,              # rotary width of the probe vectors
                    ) -> list[dict[str, float]]:
    """Top-1 needle retrieval by depth under one RoPE construction: 21 rows, one per depth.

    At each of 21 depths (0%, 5%, ..., 100% of ``context - 2``), ``trials``
    trials draw a content vector c, a query c + 0.15 noise at the last
    position, a needle c + 0.15 noise at the depth, and standard-normal
    distractor keys everywhere else (drawn as their scores, which have the
    same distribution); query and needle are rotated with the
    bands of ``method`` at factor ``context / original_context``, and a trial
    is a hit when the needle has the top score. There are no learned weights:
    the curve isolates rotary phase; it is not a language-model benchmark.

    Args:
        method: A name in ``ROPE_METHODS``, or a (frequencies, magnitude) pair.
        seed: Seed of the single generator all draws come from.
        trials: Trials per depth.
        context: Sequence length T_1.
        original_context: Trained length T_0 (the factor is context / original_context).
        dim: Rotary width of the probe vectors.

    Returns:
        21 dicts with ``depth_percent``, ``accuracy`` and ``standard_error``
        (the binomial sqrt(p(1 - p) / trials)).

    Raises:
        ValueError: If a size is not a positive integer, context < original_context
            or < 2, or the method is unknown or its bands do not fit ``dim``.
    """
    for count, what in ((trials, "trials"), (context, "context"), (original_context, "original_context")):
        _positive_int(count, what)
    if context < 2 or context < original_context:
        raise ValueError(f"context must be >= 2 and >= original_context (got {context} and {original_context})")
    if isinstance(method, str):
        frequencies, magnitude = inverse_frequencies(dim, method=method, factor=context / original_context,
                                                     original_context=original_context)
    else:
        frequencies, magnitude = method
        if frequencies.dim() != 1 or 2 * frequencies.numel() != dim:
            raise ValueError(f"custom bands must have shape ({dim // 2},) for dim {dim} (got {tuple(frequencies.shape)})")
    depths = torch.linspace(0, 1, 21, dtype=torch.float64)
    needle_at = torch.round(depths * (context - 2)).long()                        # (D,) needle positions
    gen = torch.Generator().manual_seed(seed)
    content = torch.randn(depths.numel(), trials, dim, generator=gen)             # (D, N, dim)
    query = content + 0.15 * torch.randn(content.shape, generator=gen)
    needle = content + 0.15 * torch.randn(content.shape, generator=gen)
    query_rot = apply_rope(query[:, :, None], torch.tensor([context - 1]), frequencies, magnitude)[:, :, 0]
    needle_rot = apply_rope(needle.transpose(0, 1), needle_at, frequencies, magnitude).transpose(0, 1)
    # A distractor key is magnitude * (standard normal vector), in any rotation; its score against
    # query_rot is therefore normal with standard deviation magnitude * |query_rot|. Draw the scores.
    spread = magnitude * query_rot.norm(dim=-1, keepdim=True)                     # (D, N, 1)
    scores = spread * torch.randn(depths.numel(), trials, context, generator=gen)  # (D, N, T)
    scores.scatter_(2, needle_at[:, None, None].expand(-1, trials, 1), (needle_rot * query_rot).sum(-1, keepdim=True))
    accuracy = (scores.argmax(-1) == needle_at[:, None]).double().mean(-1)       # (D,)
    return [{"depth_percent": round(100 * depth), "accuracy": p, "standard_error": math.sqrt(p * (1 - p) / trials)}
            for depth, p in zip(depths.tolist(), accuracy.tolist(), strict=True)]
