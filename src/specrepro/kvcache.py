"""KV caches: how every module runs a model with a cache, and the cache of a batch whose rows grow raggedly.

`make_cache` and `model_forward` are the one way the package makes a cache for a model and passes it in
(transformers 5 calls the keyword `cache`; older and remote-code models say `past_key_values`).

`CachedModel` is what the decoding loops (`specrepro.generate`) hold per model: the model, its cache and the log
of its forwards. Rows of a batch share one cache tensor of T slots, and a (B, T) slot mask records which slots
hold a token of the row (1) and which are padding or *holes* (0). Rows grow by different amounts in speculative
decoding (each accepts its own number of drafts: the "ragged tensor problem" of Zhang et al. 2025, arXiv
2510.22876), and this is how the cache keeps them apart without moving any tensor:

- a forward feeds each row its own new tokens, left-padded into one block with masked pad slots; positions are
  counted per row from its real tokens alone, so a row sees the positions it would see decoded on its own;
- rolling a row back turns its dropped slots into holes (mask 0), which no later token attends to; slots that
  are holes in every row at the end of the cache are cropped away;
- a row that has finished leaves the cache (`select`).

A single row never has pads or holes: its forwards pass no mask and no positions, and rollback crops, so batch 1
runs the plain causal computation (Zhang et al.'s EQSPEC realigns the cache after every step instead; holes cost
only attention over masked slots, no copies).
"""

from __future__ import annotations

import inspect
from functools import cache

import torch

from .sampling import check_logits


@cache
def _cache_keyword(forward_type) -> str:
    return "cache" if "cache" in inspect.signature(forward_type.forward).parameters else "past_key_values"


def cache_kwarg(model) -> str:
    """The keyword under which `model.forward` takes its KV cache."""
    return _cache_keyword(type(model))


def make_cache(model):
    """An empty KV cache for `model`: its own kind if it brings one (`make_cache()`, e.g. the prompt-lookup draft),
    else a transformers `DynamicCache`."""
    if hasattr(model, "make_cache"):
        return model.make_cache()
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def model_forward(model, input_ids: torch.Tensor, cache, **kwargs):
    """`model(input_ids, use_cache=True, <its cache keyword>=cache, **kwargs)`, the forward every module runs."""
    return model(input_ids=input_ids, use_cache=True, **{cache_kwarg(model): cache}, **kwargs)


def concat_features(hidden_states, layers: tuple[int, ...]) -> torch.Tensor:
    """What a feature-reading draft reads: the named entries of a transformers `hidden_states` tuple, concatenated
    along the last dimension, (..., T, len(layers) * d)."""
    return torch.cat([hidden_states[i] for i in layers], -1)


def left_padded(rows: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """Per-row (n_b, F) tensors as one (B, width, F) block, each row's at the end, zeros before (left padding);
    None stands for a row with nothing in this block."""
    first = next(r for r in rows if r is not None)
    out = first.new_zeros(len(rows), width, first.shape[-1])
    for b, r in enumerate(rows):
        if r is not None and len(r):
            out[b, width - len(r):] = r
    return out


class CachedModel:
    """A model, its KV cache over the rows of a batch, and the log of its forwards.

    Invariant kept by the loops: row b's real slots hold its tokens in order, `fed[b]` of them.
    Each forward is logged as (tokens fed per row, cache slots before it).
    """

    def __init__(self, model, who: str, log: list[tuple[int, int]], rows: int = 1):
        self.model, self.who, self.log = model, who, log
        self.cache = make_cache(model)
        self.device = next(model.parameters()).device
        self.fed = [0] * rows  # tokens of each row in the cache
        self.mask: torch.Tensor | None = None  # (B, T) long, 1 = a token of the row; None while there is no gap
        # hidden states to keep from each forward (transformers' numbering: 0 the embedding, i layer i's output),
        # for a draft that reads the target's features (`specrepro.protocol`); () keeps none
        self.hidden_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None  # (B, K, F): the last forward's, when hidden_layers is set

    @property
    def slots(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def feed(self, new: list[list[int]], n_logits: int, pad_mask: torch.Tensor | None = None,
             features: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Feed row b the tokens new[b] (one block, left-padded to the longest) and return the logits of the
        block's last n_logits positions, (B, n_logits, V): row b's last min(len(new[b]), n_logits) are its own.

        `pad_mask` (B, K) marks real tokens when the block itself is the left-padded prompt (1 = real).
        `features` (a draft that reads the target's states): row b's (len(new[b]), F), passed to the model as
        `target_features` (B, K, F), left-padded with zeros like the tokens.
        """
        width = max(len(t) for t in new)
        ids = torch.tensor([[0] * (width - len(t)) + t for t in new], device=self.device)  # (B, K)
        if pad_mask is None:
            pad_mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in new])  # (B, K)
        pad_mask = pad_mask.to(self.device, torch.long)
        extra = {}
        if features is not None:
            extra["target_features"] = left_padded(features, width).to(self.device)  # (B, K, F)
        if self.hidden_layers:
            extra["output_hidden_states"] = True
        self.log.append((width, self.slots))
        if self.mask is None and bool(pad_mask.all()):  # no gap anywhere: the plain causal forward
            out = model_forward(self.model, ids, self.cache, logits_to_keep=n_logits, **extra)
        else:
            before = self.slot_mask()
            fed = torch.tensor(self.fed, device=self.device)[:, None]  # (B, 1)
            positions = fed + (pad_mask.cumsum(-1) - 1).clamp_min(0)  # (B, K): counted over real tokens only
            self.mask = torch.cat([before, pad_mask], dim=1)  # (B, T + K)
            out = model_forward(self.model, ids, self.cache, attention_mask=self.attended(), position_ids=positions,
                                logits_to_keep=n_logits, **extra)
        if self.hidden_layers:
            self.features = concat_features(out.hidden_states, self.hidden_layers)[:, -width:]  # (B, K, F)
        self.fed = [f + int(n) for f, n in zip(self.fed, pad_mask.sum(-1).tolist())]
        logits = out.logits[:, -n_logits:]  # (B, n_logits, V)
        check_logits(torch.cat([logits[b, n_logits - min(n_logits, len(t)):] for b, t in enumerate(new)]),
                     self.who)
        return logits

    def slot_mask(self) -> torch.Tensor:
        """The (B, T) slot mask, made explicit (all ones) while there has been no gap."""
        if self.mask is not None:
            return self.mask
        return torch.ones(len(self.fed), self.slots, dtype=torch.long, device=self.device)

    def attended(self) -> torch.Tensor:
        """The attention mask a forward passes: the slot mask (a negative control passes something else)."""
        return self.mask

    def keep(self, lengths: list[int]) -> None:
        """Roll row b back to its first lengths[b] tokens (no-op for a row that holds no more)."""
        if all(k >= f for k, f in zip(lengths, self.fed)):
            return
        if self.mask is None and len(set(lengths)) == 1:  # every row drops its tail alike: crop
            self.cache.crop(lengths[0] - self.slots)  # negative: number of slots to remove
        else:
            mask = self.slot_mask()
            limit = torch.tensor(lengths, device=self.device)[:, None]  # (B, 1)
            self.mask = mask * (mask.cumsum(-1) <= limit)  # the row's slots past its length become holes
            self._crop_trailing_holes()
        self.fed = [min(k, f) for k, f in zip(lengths, self.fed)]

    def select(self, rows: list[int]) -> None:
        """Keep only the given rows (in this order): the others have finished and leave the batch."""
        index = torch.tensor(rows, device=self.device)
        self.cache.batch_select_indices(index)
        self.fed = [self.fed[i] for i in rows]
        if self.mask is not None:
            self.mask = self.mask[index]
            self._crop_trailing_holes()

    def check(self, lengths: list[int]) -> None:
        """Assert the invariants after an iteration (the loops' debug switch): row b holds lengths[b] tokens, the
        slot mask counts exactly them (so positions, counted from it, run 0..lengths[b]-1 without a gap, and no
        padding or rejected slot is attended), and the cache has a slot for each mask column."""
        problems = []
        if self.fed != list(lengths):
            problems.append(f"rows hold {self.fed} tokens, expected {list(lengths)}")
        if self.mask is not None:
            if self.mask.shape != (len(lengths), self.slots):
                problems.append(f"slot mask {tuple(self.mask.shape)} for {len(lengths)} rows x {self.slots} slots")
            elif self.mask.sum(-1).tolist() != list(lengths):
                problems.append(f"the slot mask counts {self.mask.sum(-1).tolist()} tokens per row")
        elif len(set(self.fed)) > 1 or (self.fed and self.slots != self.fed[0]):
            problems.append(f"no slot mask but rows hold {self.fed} tokens in {self.slots} slots")
        if problems:
            raise AssertionError(f"{self.who} cache: " + "; ".join(problems))

    def _crop_trailing_holes(self) -> None:
        used = self.mask.any(0).nonzero()
        end = int(used[-1]) + 1 if len(used) else 0
        if end < self.slots:
            self.cache.crop(end - self.slots)
            self.mask = self.mask[:, :end]
