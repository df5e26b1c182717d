"""Our own decoding loop behind an OpenAI-compatible /v1/completions endpoint, so the engine audit
(`specrepro.audit`) runs on ours, and on our planted bugs, exactly as it runs on llama.cpp or vLLM.

`OursServer(target, draft, gamma=4)` serves speculative sampling (`generate.decode`), `draft=None` autoregressive
decoding, `bug=...` one of `distribution.PLANTED_BUGS` (a sampler known to break the distribution). It listens on
127.0.0.1 at a free port in a thread of this process, for the `with` block. Requests are decoded one at a time
(each alone, at batch 1: the batched loop's equivalence with batch 1 is 05's subject), each with its own
`torch.Generator` seeded from the request's seed, so the same seed repeats its sample. The response carries the
generated ids in llama.cpp's logprobs layout (`choices[0].logprobs.content[i].id`) and the drafted and accepted
counts in `timings`, as llama-server's do.

`TransformersServer(target, assistant)` serves transformers' own `generate()` the same way (`bench.hf_generate`):
assisted generation with a transformers draft as `assistant_model`, or prompt lookup decoding with a
`PromptLookupDraft`, or plain sampling with `assistant=None`; transformers reports no drafted counts, so its
responses carry none.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from .distribution import planted_bug
from .generate import decode
from .sampling import SamplingConfig


def sampling_of(body: dict) -> SamplingConfig:
    """The request's sampling settings: top-k 0 / top-p 1 mean off, as in llama.cpp and vLLM."""
    top_k = int(body.get("top_k") or 0)
    top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
    return SamplingConfig(float(body.get("temperature", 1.0)), top_k if top_k > 0 else None,
                          top_p if top_p < 1 else None)


class _Endpoint:
    """The HTTP side shared by the servers here: /health, /v1/completions answered by `complete(body)` (one request
    decoded at a time), 127.0.0.1 at a free port, in a thread of this process for the `with` block."""

    tokenizer = None
    _httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def complete(self, body: dict) -> dict:
        raise NotImplementedError

    def _prompt(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this server takes prompts as lists of token ids (no tokenizer was given)")
            prompt = self.tokenizer(prompt).input_ids
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt must be text or a non-empty list of token ids")
        return prompt

    @staticmethod
    def _generator(body: dict) -> torch.Generator:
        seed = body.get("seed")
        return torch.Generator().manual_seed(int(seed) if seed is not None and int(seed) >= 0 else
                                             int.from_bytes(os.urandom(8), "little") >> 1)

    def _response(self, prompt: list[int], ids: list[int], timings: dict | None = None) -> dict:
        text = self.tokenizer.decode(ids) if self.tokenizer is not None else " ".join(map(str, ids))
        out = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": "length",
                                                         "logprobs": {"content": [{"id": t, "token": str(t)}
                                                                                  for t in ids]}}],
               "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}
        return out | ({"timings": timings} if timings is not None else {})

    def __enter__(self) -> _Endpoint:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"status": "ok"}) if self.path == "/health" else self._send(404, {"error": "not found"})

            def do_POST(self):
                if self.path != "/v1/completions":
                    return self._send(404, {"error": f"no endpoint {self.path}"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    self._send(200, server.complete(body))
                except (ValueError, TypeError, KeyError) as e:
                    self._send(400, {"error": str(e)})

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class OursServer(_Endpoint):
    """See the module docstring. `tokenizer` is needed only for prompts sent as text."""

    def __init__(self, target, draft=None, *, gamma: int = 4, bug: str | None = None, tokenizer=None,
                 eos_token_id: int | None = None):
        if draft is None and bug is not None:
            raise ValueError("a planted bug lives in the speculative loop: give a draft")
        self.target, self.draft, self.gamma, self.bug, self.tokenizer = target, draft, gamma, bug, tokenizer
        self.eos = {eos_token_id} if eos_token_id is not None else set()
        self._lock = threading.Lock()

    def complete(self, body: dict) -> dict:
        prompt, cfg, g = self._prompt(body), sampling_of(body), self._generator(body)
        steps, loop_cfg = planted_bug(self.bug, cfg) if self.bug else (None, cfg)
        with self._lock, torch.no_grad():
            r = decode(self.target, self.draft, torch.tensor([prompt]), gamma=self.gamma if self.draft else 0,
                       max_new_tokens=int(body.get("max_tokens", 16)), cfg=loop_cfg, eos=self.eos, generator=g,
                       steps=steps)
        ids = r.sequences[0, len(prompt):len(prompt) + r.rows[0].new_tokens].tolist()
        return self._response(prompt, ids, {"draft_n": sum(r.rows[0].proposed),
                                            "draft_n_accepted": sum(r.rows[0].accepted)})


class TransformersServer(_Endpoint):
    """transformers' generate() (see the module docstring). `gamma`: its num_assistant_tokens (constant schedule)
    or prompt_lookup_num_tokens; None: transformers' defaults, as a user would call it."""

    def __init__(self, target, assistant=None, *, gamma: int | None = None, tokenizer=None,
                 eos_token_id: int | None = None):
        from .bench import hf_supports

        if assistant is not None and not hf_supports(assistant):
            raise TypeError(f"transformers cannot run a {type(assistant).__name__} as its draft: give a "
                            "transformers model (assisted generation) or a PromptLookupDraft (prompt lookup)")
        self.target, self.assistant, self.gamma, self.tokenizer = target, assistant, gamma, tokenizer
        self.eos = eos_token_id
        self._lock = threading.Lock()

    def complete(self, body: dict) -> dict:
        from .bench import hf_generate

        prompt, cfg, g = self._prompt(body), sampling_of(body), self._generator(body)
        with self._lock:
            out = hf_generate(self.target, torch.tensor([prompt]), max_new_tokens=int(body.get("max_tokens", 16)),
                              temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                              eos_token_id=self.eos, assistant=self.assistant, gamma=self.gamma, generator=g)
        return self._response(prompt, out[0, len(prompt):].tolist())
