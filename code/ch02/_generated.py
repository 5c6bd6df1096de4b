# Generated from chapters/ch02-tinygpt.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
# ruff: noqa: E402, F811, I001
"""Code saved from chapters/ch02-tinygpt.qmd ("TinyGPT: a small language model and its KV cache")."""


# chapters/ch02-tinygpt.qmd:29
import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from longctx import ch01, support


# chapters/ch02-tinygpt.qmd:63
CORPUS_FILE = "pride-and-prejudice-ch01-30.txt"


class ByteTokenizer:
    """Turn text into its UTF-8 bytes and back: 256 token ids that cover every string."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` as integers in 0..255.

        Raises:
            TypeError: If ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str (got {type(text).__name__})")
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        """Return the text whose UTF-8 bytes are ``ids``; a broken byte sequence becomes U+FFFD.

        Raises:
            ValueError: If an id lies outside 0..255.
        """
        ids = [int(i) for i in ids]
        outside = [i for i in ids if not 0 <= i < self.vocab_size]
        if outside:
            raise ValueError(f"token ids must lie in 0..{self.vocab_size - 1} (got {outside[0]})")
        return bytes(ids).decode("utf-8", errors="replace")


def load_corpus() -> str:
    """Return the chapter's training text: chapters 1 to 30 of Pride and Prejudice (public domain)."""
    return support.data_path(CORPUS_FILE).read_text(encoding="utf-8")


# chapters/ch02-tinygpt.qmd:168
@dataclass(frozen=True)
class GPTConfig:
    """The sizes that fix a TinyGPT, checked when the config is created.

    Attributes:
        vocab_size: Number of token ids, ``V``.
        context_length: Rows of the learned position table: the most positions the model can address.
        d_model: Width of every token vector, ``d``.
        layers: Number of blocks, ``L``.
        heads: Attention heads per block, ``H``; must divide ``d_model``.
        dropout: Dropout probability while training (0 turns it off).

    Raises:
        ValueError: If a size is not a positive integer, ``heads`` does not
            divide ``d_model``, or ``dropout`` is outside [0, 1).
    """

    vocab_size: int
    context_length: int = 128
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "layers", "heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"{name} must be a positive integer (got {value!r})")
        if self.d_model % self.heads:
            raise ValueError(
                "heads must divide d_model so that every head gets the same width "
                f"(got d_model={self.d_model}, heads={self.heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1) (got {self.dropout!r})")

    @property
    def head_dim(self) -> int:
        """Return the width of one head, ``d_h = d_model / heads``."""
        return self.d_model // self.heads


# chapters/ch02-tinygpt.qmd:219
class CausalSelfAttention(ch01.MultiHeadAttention):
    """Chapter 1's causal multi-head attention, which can also continue from a KV cache."""

    def forward(self, x: Tensor, cache: "KVCache | None" = None, layer: int = 0) -> Tensor:
        """Return the attended tokens (B, T, d) for ``x`` (B, T, d).

        Args:
            x: The normalised token vectors of one block.
            cache: If given, ``x`` continues the cached sequence and its keys and
                values are appended to ``cache`` for ``layer`` (@sec-ch02-kv-cache).
            layer: Which of the cache's layers this attention reads and extends.
        """
        if cache is None:
            return super().forward(x)  # Chapter 1's forward: causal mask over x alone
        return attend_with_cache(self, x, cache, layer)


class FeedForward(nn.Module):
    """The per-token MLP: widen to 4d, apply GELU, project back to d."""

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.widen = nn.Linear(d_model, 4 * d_model)
        self.narrow = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Return the MLP's output, shaped like ``x``."""
        return self.dropout(self.narrow(F.gelu(self.widen(x))))  # (B, T, d) -> (B, T, 4d) -> (B, T, d)


class Block(nn.Module):
    """One pre-norm transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config.d_model, config.heads)
        self.attention_dropout = nn.Dropout(config.dropout)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = FeedForward(config.d_model, config.dropout)

    def forward(self, x: Tensor, cache: "KVCache | None" = None, layer: int = 0) -> Tensor:
        """Return the block's output (B, T, d) for ``x`` (B, T, d), reading and extending ``cache`` if given."""
        x = x + self.attention_dropout(self.attention(self.attention_norm(x), cache, layer))
        return x + self.mlp(self.mlp_norm(x))


# chapters/ch02-tinygpt.qmd:273
class TinyGPT(nn.Module):
    """A decoder-only transformer small enough to train on a laptop CPU in seconds.

    Args:
        config: The sizes; ``position_embedding`` gets ``context_length`` rows.

    Raises:
        TypeError: If ``config`` is not a ``GPTConfig``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"TinyGPT expects a GPTConfig (got {type(config).__name__})")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.context_length, config.d_model)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """Draw weights from N(0, 0.02^2) and zero the biases, as GPT-2 does."""
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int = 1) -> "KVCache":
        """Return an empty KV cache for ``batch`` sequences, with this model's layers, heads and dtype."""
        c, weight = self.config, self.token_embedding.weight
        return KVCache(c.layers, batch, c.heads, c.head_dim, dtype=weight.dtype, device=weight.device)

    def forward(self, tokens: Tensor, cache: "KVCache | None" = None) -> Tensor:
        """Return next-token logits (B, T, V) for ``tokens`` (B, T).

        With a ``cache`` the tokens continue the cached sequence: their
        positions start at ``cache.length``, and the cache grows by T in place.

        Raises:
            ValueError: If ``tokens`` is not a non-empty 2-d integer tensor of ids
                below ``vocab_size``; if the positions would run past the
                ``context_length`` rows of the position table; or if the cache
                was made for another batch size or number of layers.
        """
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            got = f"{tokens.dtype} of shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be an int64 or int32 tensor of shape (batch, time) (got {got})")
        batch, new = tokens.shape
        if new == 0 or batch == 0:
            raise ValueError(f"tokens must hold at least one position and one sequence (got shape {tuple(tokens.shape)})")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in 0..{self.config.vocab_size - 1}")
        start = 0
        if cache is not None:
            if cache.batch != batch:
                raise ValueError(f"the cache was made for batch {cache.batch}, but tokens have batch {batch}")
            if cache.layers != self.config.layers:
                raise ValueError(f"the cache holds {cache.layers} layers, but the model has {self.config.layers}")
            start = cache.length
        if start + new > self.config.context_length:
            raise ValueError(
                f"positions {start}..{start + new - 1} run past the learned position table, which has rows for "
                f"positions 0..{self.config.context_length - 1} only (context_length={self.config.context_length})"
            )
        positions = torch.arange(start, start + new, device=tokens.device)  # (T,)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (B, T, d) + (T, d)
        x = self.embedding_dropout(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)  # (B, T, d)
        return self.lm_head(self.final_norm(x))  # (B, T, V)


# chapters/ch02-tinygpt.qmd:456
def unigram_entropy(token_ids, vocab_size: int) -> float:
    """Return the entropy, in nats, of the token frequencies in ``token_ids``.

    It is the loss of the best model that ignores context and predicts every
    token with its overall frequency.

    Raises:
        ValueError: If ``token_ids`` is empty or holds an id outside 0..vocab_size-1.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("token_ids must not be empty")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"token ids must lie in 0..{vocab_size - 1}")
    counts = torch.bincount(ids, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def sample_batch(data: Tensor, batch_size: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Return ``batch_size`` random windows ``(inputs, targets)`` of ``length`` tokens, targets shifted by one."""
    starts = torch.randint(0, data.numel() - length, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(length)  # (T,)
    inputs = data[starts[:, None] + offsets]  # (B, T)
    targets = data[starts[:, None] + offsets + 1]  # (B, T): the token after each input
    return inputs, targets


def train(
    model: TinyGPT,
    token_ids,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    progress: bool = True,
    sequence_length: int | None = None,
) -> list[float]:
    """Train ``model`` in place on random windows of ``token_ids``; return the loss of every step.

    Minimises @eq-ch02-loss with AdamW, a cosine-decayed learning rate (down to
    a tenth of ``learning_rate``) and gradients clipped to norm 1. A
    ``torch.Generator`` seeded with ``seed`` picks the windows; dropout, if the
    config has any, draws from torch's global generator, seeded with ``seed``
    inside a forked RNG state so that the caller's state is left alone.

    Args:
        model: The model to train; it is left in eval mode.
        token_ids: The training tokens (a list or 1-d tensor).
        steps, batch_size, learning_rate: The run's length, windows per step and peak step size.
        seed: Seed for every random draw of the run.
        progress: Show a tqdm progress bar.
        sequence_length: Window length; defaults to the model's ``context_length``.

    Returns:
        The training loss (nats) of each step, in order.

    Raises:
        ValueError: If a count or the learning rate is not positive, the window
            does not fit the position table, or the data is shorter than one window plus one token.
    """
    length = model.config.context_length if sequence_length is None else sequence_length
    if steps <= 0 or batch_size <= 0 or not learning_rate > 0:
        raise ValueError(
            f"steps, batch_size and learning_rate must be positive (got {steps}, {batch_size}, {learning_rate})"
        )
    if not 0 < length <= model.config.context_length:
        raise ValueError(f"sequence_length must lie in 1..{model.config.context_length} (got {length})")
    data = torch.as_tensor(token_ids, dtype=torch.long)
    if data.numel() <= length:
        raise ValueError(f"token_ids must hold more than {length} tokens (got {data.numel()})")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)

    def cosine(step: int) -> float:
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))  # 1 at step 0, 0.1 at the end

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    losses = []
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for _ in tqdm(range(steps), disable=not progress, desc="training", unit="step"):
            inputs, targets = sample_batch(data, batch_size, length, generator)
            logits = model(inputs)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # @eq-ch02-loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def evaluate_loss(model: TinyGPT, token_ids, *, batches: int = 8, batch_size: int = 16, seed: int = 0) -> float:
    """Return the mean loss (@eq-ch02-loss, nats) of ``model`` on random full-length windows of ``token_ids``.

    Raises:
        ValueError: If ``token_ids`` is not longer than the model's context.
    """
    data = torch.as_tensor(token_ids, dtype=torch.long)
    length = model.config.context_length
    if data.numel() <= length:
        raise ValueError(f"token_ids must hold more than {length} tokens (got {data.numel()})")
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        inputs, targets = sample_batch(data, batch_size, length, generator)
        total += F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).item()
    model.train(was_training)
    return total / batches


# chapters/ch02-tinygpt.qmd:668
def next_token(logits: Tensor, temperature: float = 0.0, top_k: int | None = None, generator=None) -> int:
    """Return one token id chosen from a (V,) row of logits: the argmax at temperature 0, else a sample.

    Args:
        logits: Scores for each token.
        temperature: 0 for greedy; otherwise the logits are divided by it before the softmax.
        top_k: If given, only the ``top_k`` highest-scoring tokens can be drawn.
        generator: The ``torch.Generator`` that sampling draws from.
    """
    if temperature == 0:
        return int(logits.argmax())
    scaled = logits / temperature
    if top_k is not None:
        kth_best = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_best, float("-inf"))  # softmax gives these exactly 0
    probabilities = ch01.softmax(scaled, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


@torch.no_grad()
def generate(
    model: TinyGPT,
    prompt_ids,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> list[int]:
    """Return the ``max_new_tokens`` token ids that ``model`` writes after ``prompt_ids``.

    Temperature 0 is greedy decoding. A positive temperature samples, from a
    ``torch.Generator`` seeded with ``seed``. With ``use_cache`` the model reads
    each token once and keeps its keys and values (@sec-ch02-kv-cache); without
    it, every step feeds the whole sequence again. Both give the same tokens.

    Raises:
        ValueError: If the prompt is empty, ``max_new_tokens`` or ``temperature``
            is negative, ``top_k`` is outside 1..V, sampling is asked for
            without a seed, or prompt plus new tokens exceed ``context_length``.
    """
    prompt = [int(i) for i in prompt_ids]
    config = model.config
    if not prompt:
        raise ValueError("prompt_ids must hold at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (got {temperature})")
    if top_k is not None and not 1 <= top_k <= config.vocab_size:
        raise ValueError(f"top_k must be None or lie in 1..{config.vocab_size} (got {top_k})")
    if temperature > 0 and seed is None:
        raise ValueError("sampling (temperature > 0) needs a seed, so that the same call gives the same text")
    if len(prompt) + max_new_tokens > config.context_length:
        raise ValueError(
            f"the prompt ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) must fit "
            f"the position table of {config.context_length} positions"
        )
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    device = model.token_embedding.weight.device
    was_training = model.training
    model.eval()
    sequence = list(prompt)
    cache = model.new_cache(batch=1) if use_cache else None
    unread = sequence  # the tokens the model has not read yet: the prompt at first
    for _ in range(max_new_tokens):
        if cache is None:
            unread = sequence  # without a cache, read everything again
        logits = model(torch.tensor([unread], device=device), cache)  # (1, len(unread), V)
        token = next_token(logits[0, -1], temperature, top_k, generator)
        sequence.append(token)
        unread = [token]
    model.train(was_training)
    return sequence[len(prompt) :]


# chapters/ch02-tinygpt.qmd:820
class KVCache:
    """The keys and values a TinyGPT has already computed: one (B, H, T, d_h) pair per layer.

    ``keys[i]`` and ``values[i]`` start empty (T = 0) and grow by one row per
    token read. Each append concatenates, so the tensors always hold exactly the
    cached tokens (a serving system preallocates instead).

    Args:
        layers, batch, heads, head_dim: The cache's shape, ``L``, ``B``, ``H`` and ``d_h``.
        dtype, device: Where and how the tensors are stored.

    Raises:
        ValueError: If a size is not a positive integer.
    """

    def __init__(self, layers: int, batch: int, heads: int, head_dim: int, *, dtype=torch.float32, device=None):
        for name, value in (("layers", layers), ("batch", batch), ("heads", heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"{name} must be a positive integer (got {value!r})")
        self.batch = batch
        empty = (batch, heads, 0, head_dim)
        self.keys = [torch.empty(empty, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(empty, dtype=dtype, device=device) for _ in range(layers)]

    @property
    def layers(self) -> int:
        """Return the number of layers the cache holds tensors for."""
        return len(self.keys)

    @property
    def length(self) -> int:
        """Return the number of tokens cached so far (the same in every layer once a forward pass ends)."""
        return self.keys[0].shape[2]

    def append(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys and values (B, H, T_new, d_h) to ``layer``; return all of that layer's keys and values."""
        self.keys[layer] = torch.cat([self.keys[layer], key], dim=2)  # (B, H, T_old + T_new, d_h)
        self.values[layer] = torch.cat([self.values[layer], value], dim=2)  # (B, H, T_old + T_new, d_h)
        return self.keys[layer], self.values[layer]

    def nbytes(self) -> int:
        """Return the bytes held by the cached tensors, measured from the tensors themselves."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


def attend_with_cache(attention: ch01.MultiHeadAttention, x: Tensor, cache: KVCache, layer: int) -> Tensor:
    """Return causal attention (B, T_new, d) for new tokens ``x`` that continue the sequence in ``cache``.

    The new tokens' keys and values are appended to ``cache`` for ``layer``;
    new query ``i`` then attends to all cached keys and to new keys ``0..i``.
    Uses ``attention``'s own projections and Chapter 1's
    ``split_heads``, ``merge_heads`` and ``scaled_dot_product_attention``.
    """
    past, new = cache.keys[layer].shape[2], x.shape[1]  # t_0 cached tokens in this layer, T_new new ones
    heads = attention.heads
    query = ch01.split_heads(attention.query(x), heads)  # (B, T_new, d) -> (B, H, T_new, d_h)
    key = ch01.split_heads(attention.key(x), heads)  # (B, H, T_new, d_h)
    value = ch01.split_heads(attention.value(x), heads)  # (B, H, T_new, d_h)
    key, value = cache.append(layer, key, value)  # (B, H, t_0 + T_new, d_h)
    # new query i sits at position t_0 + i and may see keys 0 .. t_0 + i: a causal mask shifted by t_0
    mask = torch.ones(new, past + new, dtype=torch.bool, device=x.device).tril(diagonal=past)
    mixed, _ = ch01.scaled_dot_product_attention(query, key, value, mask)  # (B, H, T_new, d_h)
    return attention.output(ch01.merge_heads(mixed))  # (B, T_new, d)


# chapters/ch02-tinygpt.qmd:962
def kv_cache_bytes(config: GPTConfig, tokens: int, *, batch: int = 1, bytes_per_scalar: int = 4) -> int:
    """Return the bytes a TinyGPT KV cache holds after ``tokens`` tokens: ``2 * B * L * d * s * T`` (@eq-ch02-kvbytes).

    Args:
        config: The model's sizes (``layers`` is L, ``d_model`` is d).
        tokens: Tokens cached per sequence, ``T`` (0 gives 0).
        batch: Sequences, ``B``.
        bytes_per_scalar: Bytes per stored number, ``s`` (4 for float32, 2 for bfloat16).

    Raises:
        ValueError: If ``tokens`` is negative, or ``batch`` or ``bytes_per_scalar`` is not positive.
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0 (got {tokens})")
    if batch <= 0 or bytes_per_scalar <= 0:
        raise ValueError(f"batch and bytes_per_scalar must be positive (got {batch} and {bytes_per_scalar})")
    if tokens == 0:
        return 0
    scalars = ch01.kv_cache_scalars(tokens, config.d_model, layers=config.layers)  # 2 * L * d * T
    return batch * bytes_per_scalar * scalars


# chapters/ch02-tinygpt.qmd:1242
def quantize(x: Tensor, bits: int = 8, *, dim: int = -1) -> tuple[Tensor, Tensor]:
    """Return symmetric absmax codes and scales with ``x ≈ codes * scale`` (@eq-ch02-absmax).

    The scale is the largest ``|x|`` along ``dim`` divided by ``q_max = 2**(bits-1) - 1``:
    ``dim=-1`` gives one scale per row, ``dim=0`` (or ``-2`` for a matrix) one per
    column. Codes are ``round(x / scale)``, integers in ``[-q_max, q_max]``, so
    each value moves by at most half a step. A group of zeros gets scale 1.

    Args:
        x: A floating-point tensor.
        bits: Bits per code, 2 to 16.
        dim: The dimension the absmax is taken along.

    Returns:
        ``(codes, scale)``: codes of ``x``'s shape, int8 for ``bits <= 8`` and
        int16 above; ``scale`` float32, with ``dim`` kept at size 1.

    Raises:
        ValueError: If ``bits`` is not an integer in 2..16, or ``dim`` is not a dimension of ``x``.
        TypeError: If ``x`` is not a floating-point tensor.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an integer in 2..16 (got {bits!r})")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = f"a tensor of dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"quantize expects a floating-point tensor (got {got})")
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be a dimension of the {x.dim()}-d tensor (got {dim})")
    q_max = 2 ** (bits - 1) - 1
    x = x.float()
    absmax = x.abs().amax(dim=dim, keepdim=True)
    scale = torch.where(absmax > 0, absmax / q_max, torch.ones_like(absmax))  # Δ of @eq-ch02-absmax
    codes = torch.round(x / scale).clamp(-q_max, q_max)  # clamp only guards against float rounding
    return codes.to(torch.int8 if bits <= 8 else torch.int16), scale


def dequantize(codes: Tensor, scale: Tensor) -> Tensor:
    """Return the float32 values ``codes * scale`` that integer codes stand for (@eq-ch02-absmax)."""
    return codes.float() * scale
