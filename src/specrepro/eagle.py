"""A draft that reads the target's hidden states: one decoder layer over the target's features (EAGLE).

EAGLE (Li et al. 2024, arXiv 2401.15077) drafts at the feature level: the draft sees, with each token x_j, the
target's hidden state at position j - 1 (the state that produced x_j), so most of the work of predicting x_{j+1}
is already done by the target. EAGLE-3 (Li et al. 2025, arXiv 2503.01840) fuses states of a low, a middle and the
top layer, and trains the draft on its own outputs ("training-time test"), since while drafting the states of the
drafted positions are the draft's own. This module is that design, at the target's width:

    g_j = W_fuse [h^(l1)_{j-1}; h^(l2)_{j-1}; h^(l3)_{j-1}]      (a drafted position: g_j = a_{j-1}, its own output)
    a_j = Decoder(W_in [g_j; E x_j])                              one Llama decoder layer with its own KV cache
    z_j = E_cut RMSNorm(a_j) + bias                               q_{j+1} over a cut vocabulary, expanded to V

E is the target's embedding (frozen, copied at load time), E_cut its rows for the `keep` ids most frequent in the
training answers plus a catch-all row, expanded to the full vocabulary as `drafts.expand` does (`drafts.CutHead`).
The decoder layer starts as a copy of the target's last layer. Stored (bf16): W_fuse, W_in, the layer, the norm,
the bias, and the kept ids; 5.2M numbers for one layer.

In the loop (`specrepro.generate`, contract in `specrepro.protocol`) the catch-up forward of each iteration feeds the
accepted tokens with the target's features from the verification; every drafted token after it is fed with the
draft's own output, kept in its cache (`FeatureCache.last`). q depends on the prefix only (the target's features
are a function of it), so the acceptance rule keeps the target's distribution exact.

Training (`specrepro.eagle_train`) is distillation on the target's own answers, as for the ladder.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from . import paths
from .compiled import call_compiled, check_room, compile_in, width_of
from .drafts import CutHead, read_manifest, write_manifest

FEATURE_LAYERS = (2, 16, 30)  # hidden_states indices: a low, a middle layer's output, and the top (final-normed)


class FeatureCache:
    """The draft's KV cache (a transformers `DynamicCache` for its layers) and its output at each row's last fed
    position, which stands in for the target's features of the next, drafted token."""

    def __init__(self, config):
        from transformers import DynamicCache

        self.kv = DynamicCache(config=config)
        self.last: torch.Tensor | None = None  # (B, d)

    def get_seq_length(self) -> int:
        return self.kv.get_seq_length()

    def crop(self, tokens_to_remove: int) -> None:
        self.kv.crop(tokens_to_remove)

    def batch_select_indices(self, index: torch.Tensor) -> None:
        self.kv.batch_select_indices(index)
        if self.last is not None:
            self.last = self.last[index]


class FeatureDraft(nn.Module):
    """One (or `layers`) Llama decoder layer(s) over the target's fused features and the token's embedding, read
    out through a cut vocabulary head (module docstring). `target_features` names the target's hidden states it
    reads (the loops pass them, `specrepro.protocol`)."""

    def __init__(self, target, kept: torch.Tensor, feature_layers: tuple[int, ...] = FEATURE_LAYERS,
                 layers: int = 1, regress: bool = False):
        super().__init__()
        from transformers import LlamaModel

        tc = target.config
        n = tc.num_hidden_layers
        if not all(0 <= i <= n for i in feature_layers) or not feature_layers:
            raise ValueError(f"feature_layers index the target's hidden states 0..{n}, got {feature_layers}")
        if getattr(tc, "model_type", None) != "llama":
            raise ValueError(f"the feature draft copies a Llama decoder layer; the target is {tc.model_type!r}")
        d = tc.hidden_size
        body_cfg = tc.__class__.from_dict(tc.to_dict() | {"num_hidden_layers": layers, "vocab_size": 1,
                                                          "bos_token_id": None,
                                                          "eos_token_id": None, "pad_token_id": None})
        if getattr(body_cfg, "layer_types", None) is not None:
            body_cfg.layer_types = body_cfg.layer_types[:layers]
        with torch.random.fork_rng(devices=[]):
            self.body = LlamaModel(body_cfg)
        for i, layer in enumerate(self.body.layers):  # start from the target's last layers
            layer.load_state_dict(target.model.layers[n - layers + i].state_dict())
        self.body.norm = nn.Identity()  # the body returns a_j; the head normalises it
        if regress and tuple(feature_layers) != (n,):
            raise ValueError(f"a regressing draft reads the target's top state alone: feature_layers=({n},)")
        self.regress = regress
        if regress:  # a_j lives where the target's top state does (already normed): the head reads it as it is
            self.final_norm = nn.Identity()
        else:
            self.final_norm = type(target.model.norm)(d, eps=tc.rms_norm_eps)
            self.final_norm.load_state_dict(target.model.norm.state_dict())
        self.register_buffer("embed", target.get_input_embeddings().weight.detach(), persistent=False)  # (V, d)
        self.fuse = nn.Linear(len(feature_layers) * d, d, bias=False)
        self.inp = nn.Linear(2 * d, d, bias=False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            nn.init.normal_(self.fuse.weight, std=len(feature_layers) ** -0.5 / d ** 0.5)
            nn.init.normal_(self.inp.weight, std=(2 * d) ** -0.5)
        self.head = CutHead(self.embed, kept)
        self.target_features = tuple(feature_layers)
        self.layers = layers
        self.config = tc  # the target's: same vocabulary, and the loops read nothing else from it

    def make_cache(self) -> FeatureCache:
        return FeatureCache(self.body.config)

    def make_static_cache(self, *, slots: int, block: int, mode: str) -> StaticFeatureCache:
        """The compiled path's cache (`specrepro.compiled.cached_model_factory`): one row, forwards compiled."""
        return StaticFeatureCache(self.body.config, slots=slots, block=block, mode=mode)

    def get_output_embeddings(self):
        return None

    def trainable(self) -> dict[str, torch.Tensor]:
        """The tensors trained and stored (everything but the target's embedding)."""
        return {k: v for k, v in self.named_parameters()}

    def weights_read(self) -> int:
        """Weights multiplied per token: the fusion, the input projection, the layer(s) and the cut head."""
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2) + self.head.head.numel()

    def inputs(self, input_ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """W_in [g; E x]: (B, T) ids and (B, T, d) fused features -> (B, T, d)."""
        return self.inp(torch.cat([g, nn.functional.embedding(input_ids, self.embed)], -1))

    def own(self, a: torch.Tensor) -> torch.Tensor:
        """The input a drafted token gets from the draft's output a at the position before: a itself (EAGLE-3),
        or, for a regressing draft whose a estimates the target's top state, a through the same fusion."""
        return self.fuse(a) if self.regress else a

    def cut_logits(self, a: torch.Tensor) -> torch.Tensor:
        """(..., d) outputs -> (..., keep + 1) logits over the cut vocabulary."""
        return self.head(self.final_norm(a))

    def unrolled(self, tokens: torch.Tensor, features: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Training-time test (EAGLE-3): the draft's outputs a (B, T, d) at draft depths 1..depth over whole rows,
        computed as the loop computes them. Depth 1 at position j reads the target's features of j - 1 (as the
        catch-up forward does); depth k reads depth k - 1's output at j - 1 (as the k-th drafted token reads the
        draft's own state) and attends to the depth-1 keys up to j - k + 1 and to the chain of its own
        predecessors (`chain_mask`). tokens (B, T), features (B, T, F): the target's at every position."""
        B, T = tokens.shape
        g = self.fuse(torch.cat([features.new_zeros(B, 1, features.shape[-1]), features[:, :-1]], 1)
                      .to(self.fuse.weight.dtype))  # (B, T, d): position j gets the state of j - 1
        xs, outs = [self.inputs(tokens, g)], []
        for k in range(1, depth + 1):
            h = torch.cat(xs, 1)  # (B, k T, d): the inputs of depths 1..k
            position_ids = torch.arange(T, device=h.device).repeat(k)[None]  # (1, k T)
            mask = chain_mask(T, k).to(h.device)[None, None]  # (1, 1, k T, k T)
            rope = self.body.rotary_emb(h, position_ids)
            for layer in self.body.layers:
                h = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=rope)
            outs.append(h[:, -T:])
            if k < depth:
                xs.append(self.inputs(tokens, self.own(torch.cat([h.new_zeros(B, 1, h.shape[-1]), h[:, -T:-1]], 1))))
        return outs

    def forward(self, input_ids: torch.Tensor, cache: FeatureCache | None = None, use_cache: bool = True,
                logits_to_keep: int = 0, attention_mask=None, position_ids=None,
                target_features: torch.Tensor | None = None, **_):
        if target_features is not None:
            g = self.fuse(target_features.to(self.fuse.weight.dtype))  # (B, T, d)
        elif cache is not None and cache.last is not None and input_ids.shape[1] == 1:
            g = self.own(cache.last[:, None])  # a drafted token: the draft's own output at the position before
        else:
            raise ValueError("the feature draft needs target_features with the tokens it catches up on; only a "
                             "single drafted token after a forward may go without (specrepro.protocol)")
        if isinstance(cache, StaticFeatureCache):
            if attention_mask is not None or position_ids is not None:
                raise ValueError("the compiled path decodes one unpadded row: use compile=False for a batch")
            return _Out(cache.run(self, input_ids, g, logits_to_keep))
        a = self.body(inputs_embeds=self.inputs(input_ids, g), cache=cache.kv if cache is not None else None,
                      use_cache=use_cache and cache is not None, attention_mask=attention_mask,
                      position_ids=position_ids).last_hidden_state  # (B, T, d)
        if cache is not None:
            real = attention_mask[:, -1:].bool() if attention_mask is not None else None  # (B, 1): a token fed now
            last = a[:, -1]
            cache.last = last if cache.last is None or real is None else torch.where(real, last, cache.last)
        if logits_to_keep:
            a = a[:, -logits_to_keep:]
        return _Out(self.head.full(self.cut_logits(a)))


class StaticFeatureCache(FeatureCache):
    """The compiled path's `FeatureCache` (one row): a transformers `StaticCache` of `slots` slots, and the draft's
    forward compiled at widths 1 (a drafted token) and `block` (a catch-up, padded up to it, the padding's slots
    rolled back at once), as `specrepro.compiled` runs the target; a longer catch-up (the prompt) runs eagerly."""

    def __init__(self, config, *, slots: int, block: int, mode: str):
        from transformers import StaticCache

        self.kv = StaticCache(config=config, max_cache_len=slots)
        self.last = None
        self.block, self.capacity, self.mode = block, slots, mode
        self.step = compile_in(_draft_forward, mode)

    def get_seq_length(self) -> int:
        return int(self.kv.get_seq_length())

    def batch_select_indices(self, index: torch.Tensor) -> None:
        if index.tolist() != [0]:
            raise ValueError("the compiled path holds one row")

    def run(self, draft: FeatureDraft, input_ids: torch.Tensor, g: torch.Tensor, logits_to_keep: int):
        """One forward of the row's w tokens with inputs g (1, w, d): its logits (1, logits_to_keep or w, V)."""
        w = input_ids.shape[1]
        if input_ids.shape[0] != 1:
            raise ValueError(f"the compiled path drafts one row, got {input_ids.shape[0]}: use compile=False for a "
                             "batch")
        check_room(self.get_seq_length(), w, self.block, self.capacity, "draft")
        width = width_of(w, self.block)
        g = g.clone(memory_format=torch.contiguous_format)  # a view (a drafted token's) would recompile on its strides
        if width > w:  # filler after the row: token 0 and zero features, forgotten below
            input_ids = torch.cat([input_ids, input_ids.new_zeros(1, width - w)], 1)
            g = torch.cat([g, g.new_zeros(1, width - w, g.shape[-1])], 1)
        n = logits_to_keep or w
        if width == w and w > self.block:  # the prompt, eagerly: the head only where logits are asked for
            a = draft.body(inputs_embeds=draft.inputs(input_ids, g), cache=self.kv, use_cache=True).last_hidden_state
            self.last = a[:, -1]
            return draft.head.full(draft.cut_logits(a[:, -n:]))
        a, logits = self._compiled(draft, input_ids, g)
        if width > w:
            self.kv.crop(w - width)
        self.last = a[:, w - 1]
        return logits[:, w - n:w]

    def _compiled(self, draft, input_ids, g):
        (a, logits), self.step = call_compiled(self.step, (draft, input_ids, g, self.kv), eager=_draft_forward,
                                               who="feature draft")
        if self.step is _draft_forward:
            self.mode = "eager"
        return a.clone(), logits.clone()  # a compiled graph may reuse its output buffers at the next call


def _draft_forward(draft: FeatureDraft, input_ids: torch.Tensor, g: torch.Tensor, kv
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """What `StaticFeatureCache` compiles: the draft's outputs a (B, T, d) and logits (B, T, V) over a block."""
    a = draft.body(inputs_embeds=draft.inputs(input_ids, g), cache=kv, use_cache=True).last_hidden_state
    return a, draft.head.full(draft.cut_logits(a))


def chain_mask(T: int, depth: int) -> torch.Tensor:
    """(depth T, depth T) bool, True = may attend: the attention of depths 1..depth laid end to end. A query of
    depth a at position j attends to depth-1 keys at positions <= j - a + 1 (the tokens fed with the target's
    features) and to the depth-b key at position j - a + b for 1 < b <= a (the drafted tokens before it)."""
    depth_of = torch.arange(depth).repeat_interleave(T) + 1  # (depth T,)
    pos = torch.arange(T).repeat(depth)
    a, b = depth_of[:, None], depth_of[None, :]
    i, j = pos[None, :], pos[:, None]
    return ((b == 1) & (i <= j - a + 1)) | ((b > 1) & (b <= a) & (i == j - a + b))


class _Out:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


# ---- storage --------------------------------------------------------------------------------------------------------


def save(folder: Path, draft: FeatureDraft, manifest: dict) -> None:
    """The trained tensors in bf16 and the kept ids; written to a temporary folder, then renamed."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.trainable().items()}
    with paths.writing_dir(folder) as tmp:
        save_file(state | {"kept_ids": draft.head.kept.int()}, tmp / "weights.safetensors")
        write_manifest(tmp / "manifest.json", manifest | {
            "kind": "feature", "layers": draft.layers, "feature_layers": list(draft.target_features),
            "regress": draft.regress})


def load(folder: Path, manifest: dict | None = None, *, dtype: torch.dtype = torch.float32, target=None
         ) -> FeatureDraft:
    """A stored feature draft; the embedding (and the shapes) come from `target`."""
    from safetensors.torch import load_file

    manifest = manifest if manifest is not None else read_manifest(folder)
    if target is None:
        raise ValueError(f"{folder} is a feature draft that reads the target's embedding: pass target=... "
                         "(specrepro.models.load_draft does)")
    state = load_file(Path(folder) / "weights.safetensors")
    draft = FeatureDraft(target, state.pop("kept_ids").long(), tuple(manifest["feature_layers"]), manifest["layers"],
                         manifest.get("regress", False))
    missing, unexpected = draft.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    buffers = {k for k, _ in draft.named_buffers()}
    if unexpected or set(missing) - buffers:
        raise ValueError(f"{folder}/weights.safetensors does not match the feature draft: missing "
                         f"{sorted(set(missing) - buffers)}, unexpected {sorted(unexpected)}")
    return draft.to(dtype).eval()
