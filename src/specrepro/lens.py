"""The tuned-lens draft: the target's first k layers, read out over a cut vocabulary (see `specrepro.ladder`).

    h_k = layers_1..k(embed(x))          (the target's, frozen)
    z   = E_cut RMSNorm_w(h_k + A h_k + b) + bias      z: (keep + 1) logits

A tuned lens (Belrose et al. 2023, arXiv 2303.08112) is an affine translator that makes layer k's residual stream
predict the final distribution. E_cut is the target's tied embedding restricted to the `keep` ids most frequent in
the distillation rows and the target's top-1 predictions (`drafts.cut_vocabulary`), plus one catch-all row (the
mean embedding of the other ids); the logits are expanded to the full vocabulary as `drafts.expand` does it (every
unseen id gets the catch-all's logit minus log(#unseen), so together they carry its probability and none outscores
the catch-all). The cut head keeps a 1-layer draft cheap: the full 49,152-row head alone reads 28M of the target's
135M weights per token. Stored (bf16): A, b, w and the bias, 0.34M numbers per draft, and the kept ids; the rest is
copied from the target at load time (`drafts.early_exit`).

k = 0 is the cheapest rung: h_0 is the token's embedding, so the draft is a bigram model (next token from the
current one alone) with no attention and no KV cache. Its forward embeds only the tokens it is fed, and its cache
(`drafts.TokenCache`, the prompt-lookup draft's) only counts them, so the loops' rollback works unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from . import paths
from .drafts import TARGET_VOCAB, TokenCache, early_exit, full_to_cut, read_manifest, write_manifest


@dataclass
class _Out:
    logits: torch.Tensor


class LensDraft(nn.Module):
    """The target's first `layers` layers with a tuned-lens read-out over a cut vocabulary (module docstring).
    Runs in the decoding loops like any transformers model: `forward(input_ids, cache=..., ...)` with a
    `DynamicCache` of its `layers` layers (layers = 0: a `TokenCache`, which only counts tokens), full-vocabulary
    logits out."""

    def __init__(self, target, layers: int, kept: torch.Tensor):
        super().__init__()
        n = target.config.num_hidden_layers
        if not 0 <= layers < n:
            raise ValueError(f"layers must be in 0..{n - 1} (the target has {n}), got {layers}")
        self.body = early_exit(target, layers).model  # the target's embedding, first `layers` layers, final norm
        config = self.body.config
        self.final_norm = self.body.norm  # the target's final RMSNorm, applied after the lens (w is trained)
        self.body.norm = nn.Identity()  # the body returns the residual stream h_k
        self.body.requires_grad_(False)
        self.config = config
        self.layers = layers
        d = config.hidden_size
        kept = kept.long()
        if not 0 < len(kept) < TARGET_VOCAB or config.vocab_size != TARGET_VOCAB:
            raise ValueError(f"the cut head keeps 1..{TARGET_VOCAB - 1} of the target's {TARGET_VOCAB} ids (one "
                             f"catch-all stands for the rest); got {len(kept)} of {config.vocab_size}")
        emb = target.get_input_embeddings().weight.detach()
        unseen = torch.ones(TARGET_VOCAB, dtype=torch.bool)
        unseen[kept] = False
        self.lens = nn.Linear(d, d)  # A, b: zero at the start, so the lens starts as the identity (the logit lens)
        nn.init.zeros_(self.lens.weight)
        nn.init.zeros_(self.lens.bias)
        self.bias = nn.Parameter(torch.zeros(len(kept) + 1))
        self.register_buffer("kept", kept)
        self.register_buffer("head", torch.cat([emb[kept], emb[unseen].mean(0, keepdim=True)]).clone())  # (keep+1, d)
        self.register_buffer("table", full_to_cut(kept))  # (V,) full id -> cut id
        offset = torch.zeros(TARGET_VOCAB)
        offset[unseen] = -math.log(int(unseen.sum()))
        self.register_buffer("offset", offset)  # (V,)
        if layers == 0:  # no attention: a cache that only counts the tokens fed (kvcache.make_cache uses it)
            self.make_cache = TokenCache

    def trainable(self) -> dict[str, torch.Tensor]:
        """The tensors trained and stored: A, b, the norm's w and the cut head's bias."""
        return {"lens.weight": self.lens.weight, "lens.bias": self.lens.bias,
                "final_norm.weight": self.final_norm.weight, "bias": self.bias}

    def weights_read(self) -> int:
        """Weights multiplied per token: the k layers, the lens and the cut head (the embedding is a lookup)."""
        layers = sum(p.numel() for p in self.body.layers.parameters() if p.dim() >= 2)
        return layers + self.lens.weight.numel() + self.head.numel()

    def cut_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., d) residual stream -> (..., keep + 1) logits over the cut vocabulary."""
        return nn.functional.linear(self.final_norm(h + self.lens(h)), self.head, self.bias)

    def full_logits(self, z: torch.Tensor) -> torch.Tensor:
        """(..., keep + 1) -> (..., V): each unseen id gets the catch-all's logit - log(#unseen)."""
        return z.index_select(-1, self.table) + self.offset

    def get_output_embeddings(self):
        return None

    def forward(self, input_ids: torch.Tensor, cache=None, use_cache: bool = True, logits_to_keep: int = 0,
                attention_mask=None, position_ids=None, **_):
        if self.layers == 0:  # h_0 = embed(x): only the new tokens are needed; the cache records them
            if cache is not None:
                cache.extend(input_ids.tolist())
            h = self.body.embed_tokens(input_ids if not logits_to_keep else input_ids[:, -logits_to_keep:])
        else:
            h = self.body(input_ids=input_ids, cache=cache, use_cache=use_cache,
                          attention_mask=attention_mask, position_ids=position_ids).last_hidden_state  # (B, T, d)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return _Out(self.full_logits(self.cut_logits(h)))


# ---- storage --------------------------------------------------------------------------------------------------------


def save_lens(folder: Path, draft: LensDraft, manifest: dict) -> None:
    """The trained tensors in bf16 and the kept ids; written to a temporary folder, then renamed."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.trainable().items()}
    with paths.writing_dir(folder) as tmp:
        save_file(state | {"kept_ids": draft.kept.int()}, tmp / "weights.safetensors")
        write_manifest(tmp / "manifest.json", manifest | {"kind": "lens", "layers": draft.layers})


def load_lens(folder: Path, target, dtype: torch.dtype = torch.float32) -> LensDraft:
    """A stored lens draft, its frozen parts copied from `target`."""
    from safetensors.torch import load_file

    manifest = read_manifest(folder)
    if manifest.get("kind") != "lens":
        raise ValueError(f"{folder} holds a {manifest.get('kind')!r} draft, not a lens draft")
    state = load_file(Path(folder) / "weights.safetensors")
    draft = LensDraft(target, manifest["layers"], state.pop("kept_ids").long())
    with torch.no_grad():
        for k, p in draft.trainable().items():
            p.copy_(state[k].float())
    return draft.to(dtype).eval()
