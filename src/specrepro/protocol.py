"""What the decoding loops ask of a draft q, written down once (Leviathan et al. 2022, Alg. 1: q is any model of
the target's vocabulary whose distribution depends on the prefix only).

A draft is anything that runs like a transformers causal LM in the loops of `specrepro.generate`:

    out = draft(input_ids=ids, use_cache=True, cache=c, logits_to_keep=k)   # ids (B, T) long
    out.logits                                                             # (B, k, V) float, V = the target's

with `attention_mask` (B, slots + T) and `position_ids` (B, T) added for a ragged batch (`specrepro.kvcache`).
Its cache `c` is a transformers `Cache`, or its own object from `make_cache()` with the three methods the loops
call: `get_seq_length()`, `crop(negative count)` and `batch_select_indices(index)`.

What a draft may add, each optional:
- `make_cache()`: a cache of its own kind (the prompt lookup keeps tokens, not keys and values).
- `make_static_cache(slots=, block=, mode=)`: with a cache of its own, the cache `compile=` decodes on (one row,
  forwards of widths 1 and `block` compiled in `mode`; `specrepro.compiled`). Without it such a draft runs eagerly
  beside a compiled target.
- `proposal_length(tokens, gamma) -> int`: propose fewer than gamma tokens this iteration; a function of the
  row's tokens so far only, so the output distribution is unchanged.
- `target_features: tuple[int, ...]`: the draft reads the target's hidden states (EAGLE, Li et al. 2024, arXiv
  2401.15077). The loop then asks the target for `output_hidden_states`, and feeds the draft, for each token at
  position j, the concatenation of those layers' states at position j - 1 (`hidden_states[i]` as transformers
  numbers them: 0 the embedding, i the output of layer i) as the keyword `target_features` (B, T, F). A drafted
  token's position has no target state yet: the draft fills it from its own output, and the loop forgets the
  draft's cache entries for drafted tokens, so that accepted tokens are fed again with the target's states. The
  first iteration proposes nothing (the target has not run).

The target is a transformers causal LM; the loop asks it for logits, and for hidden states only when the draft
reads them. `conformance` checks a draft against this contract on a real forward.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Draft(Protocol):
    """The part of a draft every loop uses (module docstring); `runtime_checkable` checks the names only,
    `conformance` checks the behaviour."""

    config: Any  # .vocab_size: the logits per position, the target's vocabulary size

    def forward(self, input_ids: torch.Tensor, *args, **kwargs) -> Any: ...

    def parameters(self, recurse: bool = True) -> Any: ...  # the first one names the device


def feature_layers(model) -> tuple[int, ...]:
    """The target layers a draft reads (`target_features`), () for a draft that reads tokens only."""
    layers = getattr(model, "target_features", None) or ()
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise ValueError(f"target_features must be a tuple of layer indices, got {layers!r}")
    return tuple(layers)


def conformance(draft, vocab_size: int, *, feature_width: int | None = None, batch_sizes=(1, 2)) -> list[str]:
    """Run `draft` as the loops do and list every way it breaks the contract (empty: it conforms).

    A prompt of 3 tokens, then 1 more, then a crop back to 3 and a block of 2, at batch 1 and batch 2; the
    logits must have the right shape, be finite, and depend on the tokens fed only (the same block after a crop
    gives the same logits). `feature_width` is the width of the target's concatenated features, needed when the
    draft reads them; `batch_sizes=(1,)` for a draft that decodes one row at a time (the lookup hybrid).
    """
    from .kvcache import make_cache, model_forward

    problems = []
    if not isinstance(draft, Draft):
        return [f"{type(draft).__name__} lacks config / forward / parameters"]
    if getattr(draft.config, "vocab_size", None) != vocab_size:
        problems.append(f"config.vocab_size is {getattr(draft.config, 'vocab_size', None)}, the target's {vocab_size}")
    try:
        device = next(iter(draft.parameters())).device
    except StopIteration:
        return problems + ["has no parameters: the loops find the device from the first one"]
    layers = feature_layers(draft)
    if layers and feature_width is None:
        return problems + ["reads target features: pass feature_width to check it"]

    def run(cache, ids, k):
        extra = {}
        if layers:
            g = torch.Generator().manual_seed(len(ids[0]))
            extra["target_features"] = torch.randn(len(ids), len(ids[0]), feature_width, generator=g).to(device)
        return model_forward(draft, torch.tensor(ids, device=device), cache, logits_to_keep=k, **extra).logits

    with torch.no_grad():
        for rows in batch_sizes:
            prompt = [[1 + b, 2, 3] for b in range(rows)]
            cache = make_cache(draft)
            for name in ("get_seq_length", "crop", "batch_select_indices"):
                if not callable(getattr(cache, name, None)):
                    problems.append(f"its cache {type(cache).__name__} has no {name}()")
            if problems:
                return problems
            first = run(cache, prompt, 1)
            if tuple(first.shape) != (rows, 1, vocab_size):
                problems.append(f"logits of shape {tuple(first.shape)} for logits_to_keep=1, expected "
                                f"{(rows, 1, vocab_size)}")
                return problems
            run(cache, [[4]] * rows, 1)
            if cache.get_seq_length() != 4:
                problems.append(f"the cache holds {cache.get_seq_length()} slots after 4 tokens")
            cache.crop(-1)
            if cache.get_seq_length() != 3:
                problems.append(f"after crop(-1) the cache holds {cache.get_seq_length()} slots, expected 3")
            again = run(cache, [[4, 5]] * rows, 2)
            fresh = make_cache(draft)
            run(fresh, prompt, 1)
            reference = run(fresh, [[4, 5]] * rows, 2)
            if tuple(again.shape) != (rows, 2, vocab_size):
                problems.append(f"logits of shape {tuple(again.shape)} for logits_to_keep=2")
            elif not torch.isfinite(again).any(-1).all():
                problems.append("a position has no finite logit")
            elif not torch.allclose(again.float(), reference.float(), atol=1e-4, rtol=1e-4):
                problems.append("after crop(-1), the same tokens give other logits than a fresh cache: the crop "
                                "does not forget")
            cache.batch_select_indices(torch.tensor([0], device=device))
            if cache.get_seq_length() != 5:
                problems.append(f"batch_select_indices changed the length to {cache.get_seq_length()}")
    proposal_length = getattr(draft, "proposal_length", None)
    if proposal_length is not None:
        n = proposal_length([1, 2, 3, 1, 2], 3)
        if not (isinstance(n, int) and 0 <= n <= 3):
            problems.append(f"proposal_length returned {n!r}, not an integer in [0, gamma]")
    return problems
