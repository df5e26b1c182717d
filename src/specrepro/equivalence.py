"""Output equivalence of batched decoding against batch-1 greedy decoding, and the published bugs as controls.

Zhang et al. 2025 ("Batch Speculative Decoding Done Right", arXiv 2510.22876) score a batched method by comparing
each row's greedy output with the same prompt decoded alone, greedy and autoregressive:

- exact match: the share of prompts whose output is identical token for token;
- prefix match: the share of the reference's tokens before the first divergence, averaged over prompts.

Where a row diverges, `compare` asks the target, in the reference computation graph (one full forward of the
prompt and the reference tokens before the divergence, no cache), how far apart its two best logits are there.
A divergence where that gap is within float noise (`TIE_TOLERANCE`) is a numerical near-tie: the batched graph
computed slightly different logits and the argmax flipped, which greedy decoding cannot avoid. A divergence at a
clear margin is a bookkeeping bug.

Two negative controls reproduce failures the paper and the engines' trackers describe, each as a cache
bookkeeping that `specrepro.generate.decode` takes in place of the correct one (for tests and notebooks, not for
users):

- `PadsAttended`: the attention mask is all ones after left padding, so every row attends its pad slots (and the
  holes of rejected drafts): the "unaligned padding" failure behind repeated tokens and garbage at batch > 1.
- `CroppedToShortestRow`: after each iteration every row's cache is cropped to the shortest row's length, as a
  rectangular batch cache forces, and the positions are left as the rows' own lengths (Zhang et al.'s ragged
  tensor problem: position ids and KV caches desynchronise when rows accept different numbers of drafts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kvcache import CachedModel

# A divergence whose top-1/top-2 logit gap (in the reference graph) is at most this is a numerical near-tie.
# Bounds on how far one position's logits move between computation graphs: 04-numerics measured up to 8e-5 in
# float32 and 0.81 in bfloat16 for SmolLM2-135M; float64 moves by ~1e-13.
TIE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 1.0}


@dataclass(frozen=True)
class RowComparison:
    """One prompt: the batched output against its batch-1 reference."""

    row: int
    exact: bool
    prefix_match: float  # share of the reference's tokens before the first divergence
    position: int | None  # index of the first divergence among the new tokens, None if none
    reference_token: int | None
    got_token: int | None
    gap: float | None  # the target's top-1 minus top-2 logit there, in the reference graph
    near_tie: bool | None  # gap <= tolerance: float numerics; False: a bookkeeping bug

    @property
    def kind(self) -> str:
        return "match" if self.exact else ("near-tie" if self.near_tie else "bug")


def first_divergence(reference: list[int], got: list[int]) -> int | None:
    """Index of the first token where the two differ (a length difference counts), None if identical."""
    for i, (a, b) in enumerate(zip(reference, got)):
        if a != b:
            return i
    return None if len(reference) == len(got) else min(len(reference), len(got))


@torch.no_grad()
def logit_gap(target, prompt: list[int], prefix: list[int]) -> float:
    """The target's top-1 minus top-2 logit after prompt + prefix, one full forward without a cache."""
    device = next(target.parameters()).device
    logits = target(input_ids=torch.tensor([prompt + prefix], device=device)).logits[0, -1].double()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def compare(target, prompts: list[list[int]], references: list[list[int]], outputs: list[list[int]], *,
            tie_tolerance: float | None = None) -> list[RowComparison]:
    """Each row's output against its reference, with the target's logit gap at the first divergence."""
    if not len(prompts) == len(references) == len(outputs):
        raise ValueError(f"got {len(prompts)} prompts, {len(references)} references, {len(outputs)} outputs")
    if tie_tolerance is None:
        tie_tolerance = TIE_TOLERANCE.get(next(target.parameters()).dtype, 1e-3)
    rows = []
    for b, (prompt, ref, got) in enumerate(zip(prompts, references, outputs)):
        pos = first_divergence(ref, got)
        if pos is None:
            rows.append(RowComparison(b, True, 1.0, None, None, None, None, None))
            continue
        gap = logit_gap(target, prompt, ref[:pos]) if pos < len(ref) else None
        rows.append(RowComparison(
            b, False, pos / len(ref) if ref else 1.0, pos, ref[pos] if pos < len(ref) else None,
            got[pos] if pos < len(got) else None, gap, gap is not None and gap <= tie_tolerance))
    return rows


def summary(rows: list[RowComparison]) -> dict:
    """Exact match, prefix match and the divergences by kind, over the rows."""
    n = len(rows)
    return dict(prompts=n, exact_match=sum(r.exact for r in rows) / n,
                prefix_match=sum(r.prefix_match for r in rows) / n,
                near_ties=sum(r.kind == "near-tie" for r in rows), bugs=sum(r.kind == "bug" for r in rows))


def evaluate(target, prompts: list[list[int]], references: list[list[int]], outputs: list[list[int]],
             **labels) -> tuple[dict, list[dict]]:
    """`compare` and `summary` as table rows: (the summary with `labels`, one row per divergence with `labels`)."""
    rows = compare(target, prompts, references, outputs)
    divergences = [labels | dict(prompt=r.row, position=r.position, reference_token=r.reference_token,
                                 got_token=r.got_token, gap=r.gap, kind=r.kind) for r in rows if not r.exact]
    return labels | summary(rows), divergences


def transformers_batched_assisted(target, draft, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                  gamma: int) -> str:
    """What transformers' assisted generation does with a batch of more than one row: 'ran', or its error."""
    from .drafts import PromptLookupDraft

    kw = dict(prompt_lookup_num_tokens=gamma) if isinstance(draft, PromptLookupDraft) else dict(assistant_model=draft)
    try:
        with torch.no_grad():
            target.generate(input_ids, attention_mask=attention_mask, max_new_tokens=2, do_sample=False,
                            pad_token_id=0, **kw)
    except Exception as err:  # the refusal is the result
        return f"refused: {type(err).__name__}: {err}"
    return "ran"


# ---- negative controls: published batching bugs ------------------------------------------------------------------


class PadsAttended(CachedModel):
    """Control 1: the attention mask is all ones, so pads and rejected drafts' slots are attended."""

    def attended(self) -> torch.Tensor:
        return torch.ones_like(self.mask)


class CroppedToShortestRow(CachedModel):
    """Control 2: every row's cache is cropped to the shortest row, positions left at each row's own length."""

    def keep(self, lengths: list[int]) -> None:
        super().keep(lengths)
        if len(set(self.fed)) <= 1:
            return
        mask = self.slot_mask()
        # the slot just past each row's last token; a rectangular cache keeps the shortest
        ends = [int(row.nonzero()[-1]) + 1 if row.any() else 0 for row in mask]
        end = min(ends)
        if end < self.slots:
            self.cache.crop(end - self.slots)
            self.mask = mask[:, :end]
        # self.fed is left as it is: the rows' positions continue from tokens the cache no longer holds
