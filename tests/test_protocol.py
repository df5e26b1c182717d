"""The draft contract (`specrepro.protocol`) and the registry of draft kinds (`specrepro.models.DRAFT_KINDS`):
every shipped kind conforms, a broken draft is caught, and a mistyped name says what is shipped."""

import copy
import json

import pytest
import torch

from specrepro import models, paths
from specrepro.drafts import TARGET_VOCAB, LookupHybridDraft, PromptLookupDraft
from specrepro.protocol import Draft, conformance
from specrepro.tiny import tiny_draft

V = 8


def test_a_transformers_model_and_the_prompt_lookup_conform():
    assert conformance(tiny_draft(V), V) == []
    assert conformance(PromptLookupDraft(vocab_size=V), V) == []
    assert isinstance(tiny_draft(V), Draft)


def test_broken_drafts_are_caught():
    assert "config.vocab_size is 8, the target's 9" in conformance(tiny_draft(V), V + 1)[0]
    forgetful = PromptLookupDraft(vocab_size=V)
    forgetful.make_cache = lambda: _NoCrop()
    assert "after crop(-1) the cache holds 4 slots, expected 3" in conformance(forgetful, V)
    assert conformance(object(), V) == ["object lacks config / forward / parameters"]
    lying = copy.deepcopy(PromptLookupDraft(vocab_size=V))
    lying.proposal_length = lambda tokens, gamma: gamma + 1
    assert any("proposal_length returned 4" in p for p in conformance(lying, V))


class _NoCrop:
    """A cache whose crop does nothing: the rolled-back tokens stay."""

    def __init__(self):
        from specrepro.drafts import TokenCache

        self.inner = TokenCache()
        self.rows = self.inner.rows

    def get_seq_length(self):
        return self.inner.get_seq_length()

    def extend(self, block):
        self.inner.extend(block)
        self.rows = self.inner.rows

    def crop(self, n):
        pass

    def batch_select_indices(self, index):
        self.inner.batch_select_indices(index)
        self.rows = self.inner.rows


def test_every_shipped_draft_has_a_registered_kind():
    kinds = {json.loads(p.read_text())["kind"] for p in paths.MODELS.glob("*/manifest.json")}
    assert kinds and kinds <= set(models.DRAFT_KINDS)


@pytest.mark.parametrize("name", ["draft-s", "prompt-lookup", "lookup-draft-m"])
def test_shipped_drafts_without_the_target_conform(name):
    draft = models.load_shipped(paths.MODELS / name)
    one_row = isinstance(draft, LookupHybridDraft)  # decodes one sequence at a time
    assert conformance(draft, TARGET_VOCAB, batch_sizes=(1,) if one_row else (1, 2)) == []


@pytest.mark.slow
def test_every_shipped_draft_conforms(real_target):
    for folder in sorted(paths.MODELS.glob("*/manifest.json")):
        draft = models.load_shipped(folder.parent, target=real_target)
        width = (len(getattr(draft, "target_features", ()) or ()) * real_target.config.hidden_size) or None
        sizes = (1,) if isinstance(draft, LookupHybridDraft) else (1, 2)
        assert conformance(draft, TARGET_VOCAB, feature_width=width, batch_sizes=sizes) == [], folder.parent.name


@pytest.fixture(scope="module")
def real_target():
    try:
        models.gguf_path()
    except models.ModelFilesMissing as err:
        pytest.skip(str(err))
    return models.load_target()


def test_an_unknown_kind_names_the_registered_ones(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "manifest.json").write_text(json.dumps({"kind": "medusa"}))
    with pytest.raises(ValueError, match="kind 'medusa', which no loader is registered for"):
        models.load_shipped(tmp_path / "x")


@pytest.mark.parametrize("call", [lambda: models.load_pair(draft="no-such-draft"),
                                  lambda: models.load_draft("draft-xs"),
                                  lambda: models.load_pair(target="smollm2-135m", draft="draft-s"),
                                  lambda: models.load_tokenizer("smolm2")])
def test_a_mistyped_name_lists_what_is_shipped_instead_of_calling_the_hub(call):
    with pytest.raises(models.ModelFilesMissing, match=r"shipped drafts are \[.*'draft-s'.*\].*Hugging Face id"):
        call()


def test_names_that_may_be_loaded_pass_resolve(tmp_path):
    assert models.resolve("draft-s") == "draft-s"
    assert models.resolve("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert models.resolve(str(tmp_path)) == str(tmp_path)


def test_the_readmes_add_your_own_draft_example_runs_and_keeps_greedy_output():
    import re

    from specrepro import autoregressive_generate, speculative_generate
    from specrepro.generate import left_pad
    from specrepro.tiny import tiny_target

    readme = (paths.ROOT / "README.md").read_text()
    section = readme.split("## Add your own draft", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 30
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README
    draft = scope["BigramLookup"](V)
    assert conformance(draft, V) == []
    target = tiny_target(V)
    ids, mask = left_pad([[1, 2, 1, 2, 1], [3, 4]], 0)
    sp = speculative_generate(target, draft, ids, attention_mask=mask, gamma=3, max_new_tokens=12, temperature=0,
                              check_invariants=True)
    for b, row in enumerate([[1, 2, 1, 2, 1], [3, 4]]):
        ar = autoregressive_generate(target, torch.tensor([row]), max_new_tokens=12, temperature=0)
        assert sp.sequences[b, ids.shape[1]:].tolist() == ar.sequences[0, len(row):].tolist()
