"""The draft family: small distilled transformers, an expensive early-exit draft, and a zero-cost prompt lookup.

Small drafts are `PhiForCausalLM`s (a standard transformers architecture whose LM head has a bias, see below)
trained on a cut vocabulary: the `keep` most frequent token ids of the training data plus one catch-all class
standing for every other id. They are stored compactly (bf16 safetensors of the cut model + the kept ids) and
expanded at load time to SmolLM2's full 49,152-id vocabulary, so transformers' assisted generation accepts them.
Expansion gives every unseen id the catch-all's (tied) embedding and LM-head row, and a bias lowered by
log(#unseen): together the unseen ids carry exactly the catch-all's probability, spread evenly, and none can
outscore the tokens the draft was trained on (a zero row would give logit 0, which beats negative logits).

The expensive draft is the target's own first `layers` layers, final norm and LM head (Leviathan et al. 2022,
Sec. 3.3 consider drafts of many costs; c >= 0.2 here), with the last kept layer's output projections and the
final norm fine-tuned to predict the target's distribution. Only the fine-tuned tensors are stored; the rest is
copied from the target at load time.

The prompt-lookup draft (Saxena 2023, "prompt lookup decoding"; an n-gram draft) proposes the token that followed
the most recent earlier occurrence of the last n tokens, as a one-hot q. It costs no matrix work.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from . import paths
from .kvcache import make_cache, model_forward

TARGET_VOCAB = 49_152


# ---- small distilled drafts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftSpec:
    name: str
    d_model: int
    layers: int
    heads: int
    keep: int = 8191  # kept token ids; the cut vocabulary has keep + 1 entries (the last is the catch-all)
    context: int = 256

    def config(self, vocab_size: int):
        from transformers import PhiConfig

        return PhiConfig(vocab_size=vocab_size, hidden_size=self.d_model, intermediate_size=4 * self.d_model,
                         num_hidden_layers=self.layers, num_attention_heads=self.heads,
                         num_key_value_heads=self.heads, max_position_embeddings=2048, partial_rotary_factor=0.5,
                         resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=None)


def non_embedding_params(model) -> int:
    emb = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings()
    tied = head.weight is model.get_input_embeddings().weight
    return model.num_parameters() - emb - (0 if tied else head.weight.numel())


def cut_vocabulary(tokens: torch.Tensor, topk_ids: torch.Tensor, keep: int) -> torch.Tensor:
    """The `keep` ids most frequent among the corpus tokens and the target's top-1 predictions, most frequent
    first (ties by id). Returns a long tensor of full-vocabulary ids."""
    counts = torch.bincount(tokens.flatten(), minlength=TARGET_VOCAB)
    counts += torch.bincount(topk_ids[..., 0].flatten().long(), minlength=TARGET_VOCAB)
    order = torch.argsort(-counts * TARGET_VOCAB + torch.arange(TARGET_VOCAB))  # count desc, then id asc
    return order[:keep].clone()


def full_to_cut(kept: torch.Tensor) -> torch.Tensor:
    """Lookup table (TARGET_VOCAB,) from full ids to cut ids; unseen ids map to the catch-all (= len(kept))."""
    table = torch.full((TARGET_VOCAB,), len(kept), dtype=torch.long)
    table[kept] = torch.arange(len(kept))
    return table


def expand(cut_model, kept: torch.Tensor):
    """A full-vocabulary PhiForCausalLM that computes exactly the cut model's distribution on kept ids, with the
    catch-all's mass split evenly over the unseen ids."""
    from transformers import PhiForCausalLM

    config = cut_model.config.__class__.from_dict(cut_model.config.to_dict() | {"vocab_size": TARGET_VOCAB})
    with torch.random.fork_rng(devices=[]):
        full = PhiForCausalLM(config)
    cut_state = cut_model.state_dict()
    catch_all = len(kept)
    n_unseen = TARGET_VOCAB - len(kept)
    emb = cut_state["model.embed_tokens.weight"]
    bias = cut_state["lm_head.bias"]
    full_emb = emb[catch_all].repeat(TARGET_VOCAB, 1)
    full_emb[kept] = emb[:catch_all]
    full_bias = torch.full((TARGET_VOCAB,), float(bias[catch_all]) - math.log(n_unseen), dtype=bias.dtype)
    full_bias[kept] = bias[:catch_all]
    state = {k: v for k, v in cut_state.items() if k not in ("model.embed_tokens.weight", "lm_head.weight",
                                                               "lm_head.bias")}
    state |= {"model.embed_tokens.weight": full_emb, "lm_head.weight": full_emb, "lm_head.bias": full_bias}
    full.load_state_dict(state, strict=True)
    full.tie_weights()
    return full.eval()


class CutHead(nn.Module):
    """A read-out over a cut vocabulary: logits z = E_cut h + bias for the `kept` ids and one catch-all (the mean
    embedding of the others), from the target's tied embedding E (frozen); `full` expands z to the whole vocabulary
    as `expand` does (each unseen id gets the catch-all's logit - log(#unseen), so together they carry its
    probability and none outscores it). Only the bias is trained."""

    def __init__(self, embed: torch.Tensor, kept: torch.Tensor):
        super().__init__()
        vocab = embed.shape[0]
        kept = kept.long()
        if not 0 < len(kept) < vocab:
            raise ValueError(f"the cut head keeps 1..{vocab - 1} of the target's {vocab} ids (one catch-all stands "
                             f"for the rest); got {len(kept)}")
        unseen = torch.ones(vocab, dtype=torch.bool)
        unseen[kept] = False
        self.bias = nn.Parameter(torch.zeros(len(kept) + 1))
        self.register_buffer("kept", kept)
        self.register_buffer("head", torch.cat([embed[kept], embed[unseen].mean(0, keepdim=True)]).detach().clone())
        table = torch.full((vocab,), len(kept), dtype=torch.long)
        table[kept] = torch.arange(len(kept))
        self.register_buffer("table", table)  # (V,) full id -> cut id
        offset = torch.zeros(vocab)
        offset[unseen] = -math.log(int(unseen.sum()))
        self.register_buffer("offset", offset)  # (V,)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., keep + 1) logits over the cut vocabulary."""
        return nn.functional.linear(h, self.head, self.bias)

    def full(self, z: torch.Tensor) -> torch.Tensor:
        """(..., keep + 1) -> (..., V)."""
        return z.index_select(-1, self.table) + self.offset


def write_manifest(path: Path, manifest: dict) -> None:
    """The one format of a draft's manifest.json: sorted keys, two-space indent, a final newline."""
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")


def save_small(folder: Path, cut_model, kept: torch.Tensor, manifest: dict) -> None:
    """Store the cut model in bf16 with its kept ids and manifest; written to a temporary folder, then renamed."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in cut_model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding
    with paths.writing_dir(folder) as tmp:
        save_file(state | {"kept_ids": kept.int()}, tmp / "weights.safetensors")
        write_manifest(tmp / "manifest.json", manifest | {"kind": "small", "config": cut_model.config.to_dict()})


def load_small(folder: Path, manifest: dict, *, dtype: torch.dtype = torch.float32, target=None):
    """A stored small draft (`save_small`), expanded to the full vocabulary (`expand`)."""
    from safetensors.torch import load_file
    from transformers import PhiConfig, PhiForCausalLM

    state = load_file(Path(folder) / "weights.safetensors")
    kept = state.pop("kept_ids").long()
    with torch.random.fork_rng(devices=[]):
        cut = PhiForCausalLM(PhiConfig.from_dict(manifest["config"]))
    cut.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    cut.tie_weights()
    return expand(cut, kept).to(dtype)


def load_early_exit(folder: Path, manifest: dict, *, dtype: torch.dtype = torch.float32, target=None):
    """A stored early-exit draft (`save_early_exit`): the target's first layers with the fine-tuned tensors."""
    from safetensors.torch import load_file

    if target is None:
        raise ValueError(f"{folder} is an early-exit draft made of the target's first layers: pass target=... "
                         "(specrepro.models.load_draft does)")
    model = early_exit(target, manifest["layers"])
    state = load_file(Path(folder) / "weights.safetensors")
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return model.to(dtype).eval()


def load_prompt_lookup(folder: Path, manifest: dict, *, dtype: torch.dtype = torch.float32, target=None):
    """A prompt-lookup draft from its manifest (`save_prompt_lookup`); it has no weights."""
    return PromptLookupDraft(**manifest["config"])


# ---- the expensive draft: the target's first layers -------------------------------------------------------------


def early_exit(target, layers: int):
    """A model of the target's class (a LlamaForCausalLM for SmolLM2) made of its embedding, first `layers` layers,
    final norm and (tied) LM head."""
    config = target.config.__class__.from_dict(target.config.to_dict() | {"num_hidden_layers": layers})
    if hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[:layers]
    with torch.random.fork_rng(devices=[]):
        model = type(target)(config)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    model.load_state_dict(state, strict=True)
    return model.eval()


def early_exit_trainable(layers: int) -> list[str]:
    """The tensors fine-tuned (and stored): the last kept layer's output projections and the final norm."""
    last = f"model.layers.{layers - 1}"
    return [f"{last}.self_attn.o_proj.weight", f"{last}.mlp.down_proj.weight", "model.norm.weight"]


def early_exit_for_training(target, layers: int):
    """`early_exit(target, layers)` ready to fine-tune: only the `early_exit_trainable` tensors require grad (the
    rest are the target's own layers, copied and frozen), so `train.train_draft` updates those alone."""
    model = early_exit(target, layers)
    trainable = set(early_exit_trainable(layers))
    missing = trainable - {name for name, _ in model.named_parameters()}
    if missing:
        raise ValueError(f"the early-exit draft has no tensors {sorted(missing)} to fine-tune")
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    return model


def save_early_exit(folder: Path, model, layers: int, manifest: dict) -> None:
    from safetensors.torch import save_file

    state = model.state_dict()
    with paths.writing_dir(folder) as tmp:
        save_file({k: state[k].detach().to(torch.bfloat16).contiguous() for k in early_exit_trainable(layers)},
                  tmp / "weights.safetensors")
        write_manifest(tmp / "manifest.json", manifest | {"kind": "early_exit", "layers": layers})


# ---- the zero-cost draft: prompt lookup ------------------------------------------------------------------------


class TokenCache:
    """Duck-types the part of a transformers Cache the decoding loops use (a length, crop(), batch_select_indices())
    and holds the token of every slot of every row. Which slots are real (not padding, not a rejected draft) comes
    with each forward's attention mask, as it does for a transformer."""

    def __init__(self):
        self.rows: list[list[int]] = []

    @property
    def tokens(self) -> list[int]:
        """The slots of a batch of one."""
        if not self.rows:
            self.rows.append([])
        return self.rows[0]

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self.rows[:1] = [value]

    def get_seq_length(self) -> int:
        return len(self.rows[0]) if self.rows else 0

    def extend(self, block: list[list[int]]) -> None:
        if not self.rows:
            self.rows = [[] for _ in block]
        for row, new in zip(self.rows, block):
            row += new

    def crop(self, tokens_to_remove: int) -> None:
        for row in self.rows:
            del row[len(row) + tokens_to_remove:]

    def batch_select_indices(self, index: torch.Tensor) -> None:
        self.rows = [list(self.rows[i]) for i in index.tolist()]  # copies: a row selected twice grows apart


@dataclass(frozen=True)
class _LookupConfig:
    vocab_size: int = TARGET_VOCAB
    max_ngram: int = 3
    min_ngram: int = 1


class PromptLookupDraft(nn.Module):
    """An n-gram draft over the sequence itself: q is one-hot on the token that followed the latest earlier match
    of the last n tokens (n = max_ngram .. 1); with no match, on the sequence's last token. In speculative
    decoding it proposes only as far as its matches reach (`proposal_length`), as transformers' prompt lookup
    decoding does. No parameters to speak of (one scalar, so that `.parameters()` names a device); its cost is a
    few list scans."""

    def __init__(self, vocab_size: int = TARGET_VOCAB, max_ngram: int = 3, min_ngram: int = 1):
        super().__init__()
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.config = _LookupConfig(vocab_size, max_ngram, min_ngram)
        self._device_anchor = nn.Parameter(torch.zeros(()), requires_grad=False)

    def make_cache(self) -> TokenCache:
        return TokenCache()

    def get_output_embeddings(self):
        return None

    def match(self, tokens: list[int]) -> int | None:
        """The token after the latest earlier occurrence of the longest matching tail n-gram (n from max_ngram
        down to min_ngram), or None."""
        for n in range(min(self.config.max_ngram, len(tokens) - 1), self.config.min_ngram - 1, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == tail:
                    return tokens[start + n]
        return None

    def predict(self, tokens: list[int]) -> int:
        found = self.match(tokens)
        return tokens[-1] if found is None else found

    def proposal_length(self, tokens: list[int], gamma: int) -> int:
        """How many of the next gamma tokens the lookup can propose from a match: it stops at the first position
        with no match (0 when the tail matches nothing), so that no target work is spent on guesses."""
        tokens = list(tokens)
        for i in range(gamma):
            found = self.match(tokens)
            if found is None:
                return i
            tokens.append(found)
        return gamma

    def forward(self, input_ids: torch.Tensor, cache: TokenCache | None = None, logits_to_keep: int = 1,
                attention_mask: torch.Tensor | None = None, **_):
        """One-hot logits (B, logits_to_keep, V) for the block's last positions. `attention_mask` (B, slots), as
        the batched loop passes it, marks each row's real slots; padding and rejected drafts are skipped."""
        cache = cache if cache is not None else self.make_cache()
        cache.extend(input_ids.tolist())
        slots = cache.get_seq_length()
        logits = torch.full((input_ids.shape[0], logits_to_keep, self.config.vocab_size), -math.inf)
        real = attention_mask.bool().tolist() if attention_mask is not None else None
        for b, row in enumerate(cache.rows):
            for j in range(logits_to_keep):
                upto = slots - logits_to_keep + j + 1  # positions scored: the last logits_to_keep
                seq = row[:upto] if real is None else [t for t, m in zip(row[:upto], real[b]) if m]
                logits[b, j, self.predict(seq) if seq else 0] = 0.0  # no real token yet: a pad, never read
        return _Out(logits.to(self._device_anchor.device))


@dataclass
class _Out:
    logits: torch.Tensor


def save_prompt_lookup(folder: Path, max_ngram: int, manifest: dict, min_ngram: int = 1) -> None:
    cfg = asdict(_LookupConfig(TARGET_VOCAB, max_ngram, min_ngram))
    with paths.writing_dir(folder) as tmp:
        write_manifest(tmp / "manifest.json", manifest | {"kind": "prompt_lookup", "config": cfg})


# ---- lookup first, a small draft otherwise --------------------------------------------------------------------


class _HybridCache(TokenCache):
    """The tokens seen (for the lookup) and the inner model's KV cache, which may lag behind them."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.inner.get_seq_length() > len(self.tokens):
            self.inner.crop(len(self.tokens) - self.inner.get_seq_length())


class LookupHybridDraft(nn.Module):
    """Copy when the text repeats, predict otherwise: q is one-hot on the prompt-lookup continuation when the
    sequence's last `min_ngram`..`max_ngram` tokens occurred before (long matches are right most of the time: the
    target copies signatures and docstrings from its prompt), and the small draft's own q elsewhere. Like any
    draft, q depends on the prefix only, so speculative sampling stays exact. The small draft runs on every call,
    so the hybrid costs what the small draft costs."""

    def __init__(self, model, max_ngram: int = 3, min_ngram: int = 3):
        super().__init__()
        self.model = model
        self.lookup = PromptLookupDraft(model.config.vocab_size, max_ngram, min_ngram)
        self.config = model.config

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def make_cache(self) -> _HybridCache:
        return _HybridCache(make_cache(self.model))

    def forward(self, input_ids: torch.Tensor, cache: _HybridCache | None = None, logits_to_keep: int = 1, **_):
        if input_ids.shape[0] != 1:
            raise NotImplementedError("the lookup hybrid decodes one sequence at a time")
        cache = cache if cache is not None else self.make_cache()
        cache.tokens += input_ids[0].tolist()
        lag = torch.tensor([cache.tokens[cache.inner.get_seq_length():]], device=input_ids.device)
        logits = model_forward(self.model, lag, cache.inner, logits_to_keep=logits_to_keep
                               ).logits[:, -logits_to_keep:].clone()
        for j in range(logits_to_keep):
            found = self.lookup.match(cache.tokens[:len(cache.tokens) - logits_to_keep + j + 1])
            if found is not None:
                logits[0, j] = -math.inf
                logits[0, j, found] = 0.0
        return _Out(logits)


def save_lookup_hybrid(folder: Path, model_name: str, max_ngram: int, min_ngram: int, manifest: dict) -> None:
    """A hybrid is a manifest naming its small draft (a sibling folder) and the lookup's n-gram range."""
    cfg = dict(model=model_name, max_ngram=max_ngram, min_ngram=min_ngram)
    with paths.writing_dir(folder) as tmp:
        write_manifest(tmp / "manifest.json", manifest | {"kind": "lookup_hybrid", "config": cfg})


# ---- manifests ---------------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict:
    """A draft folder's manifest.json."""
    return json.loads((Path(folder) / "manifest.json").read_text())
