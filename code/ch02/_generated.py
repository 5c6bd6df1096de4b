# Generated from chapters/ch02-tinygpt.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch02-tinygpt.qmd ("TinyGPT: a small language model and its KV cache")."""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from longctx import ch01, support
from longctx.support import (
    check_bits,
    check_bool,
    check_divides,
    check_int,
    check_int_sequence,
    check_number,
    check_type,
)

# chapters/ch02-tinygpt.qmd:77
#: The training text's file in the package's data folder (``data_path``).
CORPUS_FILE = "pride-and-prejudice-ch01-30.txt"


class ByteTokenizer:
    """Turn text into its UTF-8 bytes and back: 256 ids cover every string."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` as integers in 0..255.

        Raises:
            TypeError: If ``text`` is not a ``str``.
        """
        check_type("text", text, str)
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """Return the text whose UTF-8 bytes are ``ids``.

        A broken byte sequence becomes the replacement character U+FFFD.

        Raises:
            TypeError: If ``ids`` is not a sequence of integers.
            ValueError: If an id lies outside 0..255.
        """
        last = self.vocab_size - 1
        ids = check_int_sequence("ids", ids, minimum=0, maximum=last)
        return bytes(ids.tolist()).decode("utf-8", errors="replace")


def load_corpus() -> str:
    """Return the training text: chapters 1 to 30 of Pride and Prejudice."""
    return support.data_path(CORPUS_FILE).read_text(encoding="utf-8")


# chapters/ch02-tinygpt.qmd:193
@dataclass(frozen=True)
class GPTConfig:
    """The sizes that fix a TinyGPT, checked when the config is created.

    Attributes:
        vocab_size: Number of token ids, ``n_vocab``.
        context_length: Rows of the learned position table: the most
            positions the model can address.
        d_model: Width of every token vector, ``d``.
        layers: Number of blocks, ``L``.
        heads: Attention heads per block, ``H``; must divide ``d_model``.
        dropout: Dropout probability while training (0 turns it off).

    Raises:
        TypeError: If a size is not an int or ``dropout`` is not a number.
        ValueError: If a size is not positive, ``heads`` does not divide
            ``d_model``, or ``dropout`` is outside [0, 1).
    """

    vocab_size: int
    context_length: int = 128
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        store = partial(object.__setattr__, self)  # frozen: plain values back
        store("vocab_size", check_int("vocab_size", self.vocab_size, minimum=1))
        store("context_length",
              check_int("context_length", self.context_length, minimum=1))
        store("d_model", check_int("d_model", self.d_model, minimum=1))
        store("layers", check_int("layers", self.layers, minimum=1))
        store("heads", check_int("heads", self.heads, minimum=1))
        check_divides("heads", self.heads, "d_model", self.d_model)
        store("dropout",
              check_number("dropout", self.dropout, minimum=0, below=1))

    @property
    def head_dim(self) -> int:
        """Return the width of one head, ``d_h = d_model / heads``."""
        return self.d_model // self.heads


# chapters/ch02-tinygpt.qmd:249
class CausalSelfAttention(ch01.MultiHeadAttention):
    """Chapter 1's causal multi-head attention, able to continue a KV cache.

    Args:
        d_model: Width d of each token's vector.
        heads: Number of heads H; must divide ``d_model`` (head width
            d_h = d / H).
        bias: Whether the four linear layers have biases.
    """

    def forward(
        self, x: Tensor, cache: "KVCache | None" = None, layer: int = 0
    ) -> Tensor:
        """Return the attended tokens (B, T, d) for ``x`` (B, T, d).

        Args:
            x: The normalised token vectors of one block.
            cache: If given, ``x`` continues the cached sequence: its
                heads go to ``cache.attend``, which caches the keys and
                values for ``layer`` and attends over all of them.
            layer: Which of the cache's layers this attention reads and
                extends.
        """
        start = 0 if cache is None else cache.position(layer)  # t_0
        query, key, value = (ch01.split_heads(projection(x), self.heads)
                             for projection in (self.query, self.key,
                                                self.value))  # (B, H, T, d_h)
        query, key = self.add_positions(query, key, start)
        if cache is None:
            mixed = self.attend(query, key, value)  # x attends to itself
        else:
            mixed = cache.attend(layer, query, key, value)  # and the cache
        return self.output(ch01.merge_heads(mixed))  # (B, T, d)

    def add_positions(
        self, query: Tensor, key: Tensor, start: int
    ) -> tuple[Tensor, Tensor]:
        """Return ``query`` and ``key`` (B, H, T, d_h) with their positions.

        The T tokens sit at positions ``start``, ``start + 1``, ... TinyGPT
        added its position vectors to the tokens already, so both pass
        unchanged; ``ch06``'s rotary attention turns them here.
        """
        return query, key

    def attend(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Return Chapter 1's causal attention (B, H, T, d_h) of T tokens."""
        mask = ch01.causal_mask(query.shape[2], device=query.device)
        return ch01.scaled_dot_product_attention(query, key, value, mask)[0]


class FeedForward(nn.Module):
    """The per-token MLP: widen to 4d, apply GELU, project back to d.

    Args:
        d_model: Width d of each token's vector.
        dropout: Probability in [0, 1) of zeroing an output while training.
    """

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        """Build the two linear layers; the Args are the class's."""
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        dropout = check_number("dropout", dropout, minimum=0, below=1)
        self.widen = nn.Linear(d_model, 4 * d_model)
        self.narrow = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Return the MLP's output for ``x`` (..., d), shaped like ``x``."""
        wide = F.gelu(self.widen(x))  # (..., d) -> (..., 4d)
        return self.dropout(self.narrow(wide))  # (..., 4d) -> (..., d)


class Block(nn.Module):
    """One pre-norm transformer block.

    ``x + attention(norm(x))``, then ``x + mlp(norm(x))``.

    Args:
        config: The model's sizes: ``d_model``, ``heads`` and ``dropout``.
    """

    def __init__(self, config: GPTConfig) -> None:
        """Build the two norms, the attention and the MLP."""
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config.d_model, config.heads)
        self.attention_dropout = nn.Dropout(config.dropout)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = FeedForward(config.d_model, config.dropout)

    def forward(
        self, x: Tensor, cache: "KVCache | None" = None, layer: int = 0
    ) -> Tensor:
        """Return the block's output (B, T, d) for ``x`` (B, T, d).

        With a ``cache``, the attention reads it and extends it.
        """
        attended = self.attention(self.attention_norm(x), cache, layer)
        x = x + self.attention_dropout(attended)
        return x + self.mlp(self.mlp_norm(x))


# chapters/ch02-tinygpt.qmd:359
class TinyGPT(nn.Module):
    """A decoder-only transformer small enough to train on a CPU in seconds.

    Called on token ids (B, T), T at most ``config.context_length``, it
    returns next-token logits (B, T, vocab_size).

    Args:
        config: The sizes; ``position_embedding`` gets ``context_length``
            rows.

    Raises:
        TypeError: If ``config`` is not a ``GPTConfig``.
    """

    def __init__(self, config: GPTConfig) -> None:
        """Build the embeddings, blocks and head; the Args are the class's."""
        super().__init__()
        self.config = check_type("config", config, GPTConfig)
        rows, d = config.context_length, config.d_model
        self.token_embedding = nn.Embedding(config.vocab_size, d)
        self.position_embedding = nn.Embedding(rows, d)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """Draw weights from N(0, 0.02^2) and zero the biases, as GPT-2 does."""
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int = 1) -> "KVCache":
        """Return an empty KV cache for ``batch`` sequences.

        It has this model's layers, heads, head width, dtype and device.
        """
        c, weight = self.config, self.token_embedding.weight
        sizes = (c.layers, batch, c.heads, c.head_dim)
        return KVCache(*sizes, dtype=weight.dtype, device=weight.device)

    def forward(self, tokens: Tensor, cache: "KVCache | None" = None) -> Tensor:
        """Return next-token logits (B, T, n_vocab) for ``tokens`` (B, T).

        With a ``cache`` the tokens continue the cached sequence: their
        positions start at ``cache.length``, and the cache grows by T in
        place. Positions past the table's last row are refused, with a
        message that says so rather than the embedding's index error.
        """
        c = self.config
        new = tokens.shape[1]
        start = 0 if cache is None else cache.length
        if start + new > c.context_length:
            raise ValueError(
                f"positions {start}..{start + new - 1} run past the learned "
                "position table, which has rows for positions "
                f"0..{c.context_length - 1} only "
                f"(context_length={c.context_length})"
            )
        positions = torch.arange(start, start + new, device=tokens.device)
        x = self.token_embedding(tokens)  # (B, T) -> (B, T, d)
        x = x + self.position_embedding(positions)  # + (T, d), broadcast
        x = self.embedding_dropout(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)  # (B, T, d)
        return self.lm_head(self.final_norm(x))  # (B, T, d) -> (B, T, n_vocab)


# chapters/ch02-tinygpt.qmd:555
def unigram_entropy(
    token_ids: Iterable[int] | Tensor, vocab_size: int
) -> float:
    """Return the entropy, in nats, of the token frequencies in ``token_ids``.

    It is the loss of the best model that ignores context and predicts every
    token with its overall frequency: ``-sum_v f_v ln f_v``, with
    ``f_v`` the share of the ids equal to ``v`` (ids in 0..vocab_size-1).
    No ids have no entropy: an empty ``token_ids`` is refused, not given 0.
    """
    ids = check_int_sequence("token_ids", token_ids, nonempty=True)
    counts = torch.bincount(ids, minlength=vocab_size).double()  # (n_vocab,)
    f = counts[counts > 0] / counts.sum()
    return float(-(f * f.log()).sum())


def sample_batch(
    data: Tensor, batch_size: int, length: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Return ``batch_size`` random windows ``(inputs, targets)`` of ``data``.

    ``data`` is a 1-d int64 tensor of more than ``length`` token ids. Each
    window holds ``length`` tokens, ``inputs`` and ``targets`` are both
    (batch_size, length), and the targets are the windows moved one token on.
    """
    last_start = data.numel() - length  # no window's targets pass data[-1]
    starts = torch.randint(0, last_start, (batch_size,), generator=generator)
    offsets = torch.arange(length)  # (T,)
    inputs = data[starts[:, None] + offsets]  # (B, 1) + (T,) -> (B, T)
    targets = data[starts[:, None] + offsets + 1]  # (B, T): the next tokens
    return inputs, targets


def training_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: Tensor,
    *,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    clip_norm: float | None = 1.0,
) -> float:
    """Take one optimiser step down the gradient of ``loss``; return its value.

    Zero the gradients, backpropagate the scalar ``loss``, clip the norm of
    all of ``model``'s gradients to ``clip_norm`` (``None``: no clipping),
    step ``optimizer``, then ``schedule`` if there is one. ``ch04`` and ``ch06``
    train their models with this step too.
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if schedule is not None:
        schedule.step()
    return loss.item()


def train(
    model: TinyGPT,
    token_ids: Iterable[int] | Tensor,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    progress: bool = True,
    sequence_length: int | None = None,
) -> list[float]:
    """Train ``model`` in place on random windows of ``token_ids``.

    Minimises Equation 2.1 with AdamW, a cosine-decayed learning rate (down
    to a tenth of ``learning_rate``) and gradients clipped to norm 1. A
    ``torch.Generator`` seeded with ``seed`` picks the windows; dropout, if
    the config has any, draws from torch's global generator, seeded with
    ``seed`` inside a forked RNG state so that the caller's state is left
    alone.

    Args:
        model: The model to train; it is left in eval mode.
        token_ids: The training tokens (a list or 1-d tensor).
        steps, batch_size, learning_rate: The run's length, windows per step
            and peak step size.
        seed: Seed for every random draw of the run.
        progress: Show a tqdm progress bar.
        sequence_length: Window length; defaults to the model's
            ``context_length``.

    Returns:
        The training loss (nats) of each step, in order.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If a count or the learning rate is not positive, the
            window does not fit the position table, or ``token_ids`` holds an
            id outside the vocabulary or no more than one window of tokens.
    """
    check_type("model", model, TinyGPT)
    config = model.config
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    learning_rate = check_number("learning_rate", learning_rate, above=0)
    seed = check_int("seed", seed, minimum=0)
    progress = check_bool("progress", progress)
    sequence_length = check_int("sequence_length", sequence_length, minimum=1,
                                maximum=config.context_length, optional=True)
    length = sequence_length or config.context_length
    data = check_int_sequence("token_ids", token_ids, minimum=0,
                              maximum=config.vocab_size - 1,
                              min_length=length + 1)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate,
                                  weight_decay=0.01)

    def cosine(step: int) -> float:  # 1 at step 0, 0.1 at the last step
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    losses = []
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        bar = tqdm(range(steps), disable=not progress, desc="training",
                   unit="step")
        for _ in bar:
            inputs, targets = sample_batch(data, batch_size, length, generator)
            logits = model(inputs)  # (B, T, n_vocab)
            # Equation 2.1 over all B * T positions:
            # (B*T, n_vocab) against (B*T,)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            losses.append(training_step(model, optimizer, loss,
                                        schedule=schedule))
    model.eval()
    return losses


@torch.no_grad()
def evaluate_loss(
    model: TinyGPT,
    token_ids: Iterable[int] | Tensor,
    *,
    batches: int = 8,
    batch_size: int = 16,
    seed: int = 0,
) -> float:
    """Return the mean loss of ``model`` on random windows of ``token_ids``.

    The loss is Equation 2.1 in nats, over ``batches`` batches of
    ``batch_size`` windows of the model's full context length.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If a count is not positive, or ``token_ids`` holds an id
            outside the vocabulary or is not longer than the model's context.
    """
    check_type("model", model, TinyGPT)
    config = model.config
    batches = check_int("batches", batches, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    length = config.context_length
    data = check_int_sequence("token_ids", token_ids, minimum=0,
                              maximum=config.vocab_size - 1,
                              min_length=length + 1)
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        inputs, targets = sample_batch(data, batch_size, length, generator)
        logits = model(inputs)  # (B, T, n_vocab)
        total += F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    model.train(was_training)
    return total / batches


# chapters/ch02-tinygpt.qmd:846
def next_token(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Return one token id chosen from a (n_vocab,) row of logits.

    At temperature 0 it is the argmax. Otherwise it is drawn, with
    ``generator``, from the softmax of ``logits / temperature``, after all
    but the ``top_k`` highest logits (if given) are set to ``-inf``.
    """
    if temperature == 0:
        return int(logits.argmax())
    assert generator is not None, "sampling draws from a torch.Generator"
    scaled = logits / temperature
    if top_k is not None:
        kth_best = torch.topk(scaled, top_k).values[-1]
        too_low = scaled < kth_best
        scaled = scaled.masked_fill(too_low, float("-inf"))  # weight exactly 0
    probabilities = ch01.softmax(scaled, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


@torch.no_grad()
def generate(
    model: TinyGPT,
    prompt_ids: Iterable[int] | Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> list[int]:
    """Return the ``max_new_tokens`` ids that ``model`` writes after a prompt.

    Temperature 0 is greedy decoding. A positive temperature samples, from a
    ``torch.Generator`` seeded with ``seed``. With ``use_cache`` the model
    reads each token once and keeps its keys and values in a ``KVCache``;
    without it, every step feeds the whole sequence again. Both give the
    same tokens.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If the prompt is empty or holds an id outside 0..n_vocab-1,
            ``max_new_tokens`` or ``temperature`` is negative, ``top_k`` is
            outside 1..n_vocab, sampling is asked for without a seed, or prompt
            plus new tokens exceed ``context_length`` (``max_new_tokens``
            is then above the positions left).
    """
    check_type("model", model, TinyGPT)
    config = model.config
    vocab = config.vocab_size
    prompt = check_int_sequence("prompt_ids", prompt_ids, minimum=0,
                                maximum=vocab - 1, nonempty=True,
                                max_length=config.context_length).tolist()
    room = config.context_length - len(prompt)  # positions the table has left
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0,
                               maximum=room)
    temperature = check_number("temperature", temperature, minimum=0)
    top_k = check_int("top_k", top_k, minimum=1, maximum=vocab, optional=True)
    seed = check_int("seed", seed, minimum=0, optional=True)
    use_cache = check_bool("use_cache", use_cache)
    if temperature > 0 and seed is None:
        raise ValueError(
            "sampling (temperature > 0) needs a seed, so that the same call "
            "gives the same text"
        )
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    device = model.token_embedding.weight.device
    was_training = model.training
    model.eval()
    sequence = list(prompt)
    cache = model.new_cache(batch=1) if use_cache else None
    unread = sequence  # the tokens the model has not read: the prompt first
    for _ in range(max_new_tokens):
        if cache is None:
            unread = sequence  # without a cache, read everything again
        tokens = torch.tensor([unread], device=device)  # (1, T_unread)
        logits = model(tokens, cache)  # (1, T_unread, n_vocab)
        token = next_token(logits[0, -1], temperature, top_k, generator)
        sequence.append(token)
        unread = [token]
    model.train(was_training)
    return sequence[len(prompt) :]


# chapters/ch02-tinygpt.qmd:1048
class KVCache:
    """The keys and values a TinyGPT has computed: (B, H, T, d_h) per layer.

    ``keys[i]`` and ``values[i]`` start empty (T = 0) and grow by one row per
    token read. Each append concatenates, so the tensors always hold exactly
    the cached tokens (a serving system preallocates instead).

    ``TinyGPT.new_cache`` builds one from the model's checked config:
    ``layers``, ``batch``, ``heads`` and ``head_dim`` are its shape, ``L``,
    ``B``, ``H`` and ``d_h``; ``dtype`` and ``device`` those of the weights.
    An attention layer calls ``position`` and ``attend``; any object with
    those two methods can stand in for this cache.

    Args:
        layers: Number of layers L, one key and one value tensor each.
        batch: Number of sequences B.
        heads: Number of heads H.
        head_dim: Width d_h of one head.
        dtype: The tensors' dtype (the model's weights').
        device: Where the tensors live (the model's weights').
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.batch = batch
        empty = (batch, heads, 0, head_dim)  # T = 0 tokens so far
        self.keys = [torch.empty(empty, dtype=dtype, device=device)
                     for _ in range(layers)]
        self.values = [torch.empty(empty, dtype=dtype, device=device)
                       for _ in range(layers)]

    @property
    def layers(self) -> int:
        """Return the number of layers the cache holds tensors for."""
        return len(self.keys)

    @property
    def length(self) -> int:
        """Return the number of tokens cached so far.

        It is the same in every layer once a forward pass ends.
        """
        return self.keys[0].shape[2]

    def position(self, layer: int) -> int:
        """Return where ``layer``'s next token sits: the tokens it holds."""
        return self.keys[layer].shape[2]

    def append(
        self, layer: int, key: Tensor, value: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Add new keys and values (B, H, T_new, d_h) to ``layer``.

        Returns all of that layer's keys and values, T_old + T_new tokens.
        """
        # (B, H, T_old, d_h) + (B, H, T_new, d_h) -> (B, H, T_old + T_new, d_h)
        self.keys[layer] = torch.cat([self.keys[layer], key], dim=2)
        self.values[layer] = torch.cat([self.values[layer], value], dim=2)
        return self.keys[layer], self.values[layer]

    def attend(
        self, layer: int, query: Tensor, key: Tensor, value: Tensor
    ) -> Tensor:
        """Return causal attention (B, H, T_new, d_h) of T_new new tokens.

        Their keys and values (B, H, T_new, d_h) are appended to ``layer``
        first, so each new query sees every cached key and the new ones up
        to its own (``attend_with_cache``).
        """
        key, value = self.append(layer, key, value)  # (B, H, t_0 + T_new, d_h)
        return attend_with_cache(query, key, value)[0]

    def nbytes(self) -> int:
        """Return the bytes the cached tensors hold, measured from them."""
        tensors = self.keys + self.values
        return sum(t.numel() * t.element_size() for t in tensors)


def attend_with_cache(
    query: Tensor, key: Tensor, value: Tensor
) -> tuple[Tensor, Tensor]:
    """Return Chapter 1's ``(output, weights)`` for the newest queries.

    ``query`` (B, H, T_new, d_h) holds the last T_new of the T tokens whose
    keys and values (B, H, T, d_h), cached ones first, are given. New query
    ``i`` attends to the t_0 = T - T_new cached keys and to new keys
    ``0..i``; with nothing cached that is Chapter 1's causal mask.
    """
    past, new = key.shape[2] - query.shape[2], query.shape[2]  # t_0, T_new
    # new query i sits at position t_0 + i and may see keys 0 .. t_0 + i:
    # a causal mask shifted by t_0
    mask = torch.ones(new, past + new, dtype=torch.bool, device=query.device)
    mask = mask.tril(diagonal=past)  # (T_new, t_0 + T_new)
    return ch01.scaled_dot_product_attention(query, key, value, mask)


# chapters/ch02-tinygpt.qmd:1430
def kv_cache_bytes(
    config: GPTConfig, tokens: int, *, batch: int = 1, bytes_per_scalar: int = 4
) -> int:
    """Return the bytes a TinyGPT KV cache holds after ``tokens`` tokens.

    Equation 2.2: ``2 * B * L * d * s * T``.

    Args:
        config: The model's sizes (``layers`` is L, ``d_model`` is d).
        tokens: Tokens cached per sequence, ``T`` (0 gives 0).
        batch: Sequences, ``B``.
        bytes_per_scalar: Bytes per stored number, ``s`` (4 for float32, 2
            for bfloat16).

    Negative counts, which would give a byte count that looks right, are
    refused.
    """
    tokens = check_int("tokens", tokens, minimum=0)
    batch = check_int("batch", batch, minimum=0)
    scalar_bytes = check_int("bytes_per_scalar", bytes_per_scalar, minimum=0)
    layers, width = config.layers, config.d_model
    scalars = ch01.kv_cache_scalars(tokens, width, layers=layers)  # 2 L d T
    return batch * scalar_bytes * scalars


# chapters/ch02-tinygpt.qmd:1564
#: The bit widths quantize's codes can hold: int8 up to 8 bits, int16 to 16.
QUANTIZE_BITS = range(2, 17)


def quantize(
    x: Tensor, bits: int = 8, *, dim: int = -1
) -> tuple[Tensor, Tensor]:
    """Return symmetric absmax codes and scales with ``x ≈ codes * scale``.

    Equation 2.3: the scale is the largest ``|x|`` along ``dim`` divided by
    ``c_max = 2**(bits-1) - 1``; ``dim=-1`` gives one scale per row,
    ``dim=0`` (or ``-2`` for a matrix) one per column. Codes are
    ``round(x / scale)``, integers in ``[-c_max, c_max]``, so each value
    moves by at most half a step. A group of zeros gets scale 1.

    ``codes`` has ``x``'s shape, int8 for ``bits <= 8`` and int16 above;
    ``scale`` is float32, with ``dim`` kept at size 1. ``bits`` must be one
    of ``QUANTIZE_BITS``: one bit would leave no code but 0, and more than
    16 would wrap around in int16, so any other width is refused.
    """
    bits = check_bits("bits", bits, QUANTIZE_BITS)
    c_max = 2 ** (bits - 1) - 1
    x = x.float()
    absmax = x.abs().amax(dim=dim, keepdim=True)
    ones = torch.ones_like(absmax)
    scale = torch.where(absmax > 0, absmax / c_max, ones)  # σ, Equation 2.3
    codes = torch.round(x / scale).clamp(-c_max, c_max)  # guards rounding only
    return codes.to(torch.int8 if bits <= 8 else torch.int16), scale


def dequantize(codes: Tensor, scale: Tensor) -> Tensor:
    """Return the float32 values ``codes * scale`` (Equation 2.3).

    ``scale`` broadcasts to the codes' shape, as ``quantize`` returns it.
    """
    return codes.float() * scale
