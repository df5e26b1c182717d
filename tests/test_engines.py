"""llama.cpp as a managed process (`specrepro.engines`): a server that crashes, hangs or is left by an exception
never leaves a process behind; and, where llama-server is built (`make test` builds it), the audit against the
real engine: greedy output equal alone and under concurrency, and its speculative modes running."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time

import pytest

from specrepro import audit, engines

FAKE = textwrap.dedent("""\
    #!{python}
    # a stand-in for llama-server: MODE=crash exits, MODE=hang ignores SIGTERM and never answers, MODE=serve answers
    # /health and starts a child process, so killing only the parent would leave one behind
    import http.server, os, signal, subprocess, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ["FAKE_MODE"]
    if mode == "crash":
        print("error: model file is broken", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.environ["FAKE_PIDS"], "w").write(f"{{os.getpid()}} {{child.pid}}")
    if mode == "hang":
        time.sleep(600)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent's wait() counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pids, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def fake(tmp_path, monkeypatch):
    exe = tmp_path / "llama-server"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("FAKE_PIDS", str(tmp_path / "pids"))

    def server(mode, **kw):
        monkeypatch.setenv("FAKE_MODE", mode)
        return engines.LlamaServer(model, executable=exe, log_path=tmp_path / "server.log", **kw)

    return server, tmp_path / "pids"


def pids_of(path):
    return [int(x) for x in path.read_text().split()]


def test_a_server_that_crashes_while_starting_reports_its_log(fake):
    server, _ = fake
    with pytest.raises(engines.EngineUnavailable, match="(?s)exited with 3.*model file is broken"), server("crash"):
        pass


def test_a_hung_server_is_killed_with_its_children_after_the_start_timeout(fake):
    server, pids = fake
    with pytest.raises(engines.EngineUnavailable, match="did not answer /health"), server("hang", startup_s=3):
        pass
    assert gone(pids_of(pids))


def test_a_running_server_and_its_children_are_killed_on_an_exception_in_the_block(fake):
    server, pids = fake
    with pytest.raises(RuntimeError, match="boom"), server("serve") as s:
        assert s.url.startswith("http://127.0.0.1:")
        raise RuntimeError("boom")
    assert gone(pids_of(pids))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_client_killed_outright_takes_its_server_with_it(fake, tmp_path):
    import subprocess

    _, pids = fake
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""\
        import os, sys, time
        from pathlib import Path
        from specrepro import engines
        os.environ["FAKE_MODE"] = "serve"
        folder = Path(sys.argv[1])
        with engines.LlamaServer(folder / "model.gguf", executable=folder / "llama-server",
                                 log_path=folder / "server.log"):
            print("up", flush=True)
            time.sleep(600)
        """))
    client = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "up"
    server_pid, child_pid = pids_of(pids)
    assert alive(server_pid)
    client.kill()  # no finally block runs
    client.wait()
    assert gone([server_pid])
    try:  # the parent-death signal reaches the server alone (llama-server starts no children); the fake's child stays
        os.kill(child_pid, 9)
    except ProcessLookupError:
        pass


def test_missing_binary_or_model_says_what_to_run(tmp_path):
    with pytest.raises(engines.EngineUnavailable, match="make llama-cpp"), \
            engines.LlamaServer(tmp_path / "m.gguf", executable=tmp_path / "nope"):
        pass
    exe = tmp_path / "exe"
    exe.write_text("")
    with pytest.raises(engines.EngineUnavailable, match="does not exist"), \
            engines.LlamaServer(tmp_path / "m.gguf", executable=exe):
        pass


def _report(*tests):
    import json

    return json.dumps([dict(n_prompt=p, n_gen=g, n_depth=256, samples_ns=ns, n_threads=2, flash_attn=-1,
                            model_type="llama ?B all F32") for p, g, ns in tests])


def test_bench_rows_time_a_forward_whole_and_a_decode_run_per_step():
    rows = engines.bench_rows(_report((4, 0, [30e6, 20e6, 25e6]), (0, 32, [320e6, 640e6, 480e6])))
    forward, decode = rows
    assert (forward.test, forward.tokens, forward.depth, forward.ms) == ("forward", 4, 256, 25.0)
    assert (decode.test, decode.tokens, decode.ms) == ("decode", 32, 15.0)  # 480 ms over 32 steps
    assert decode.samples_ms == (10.0, 20.0, 15.0)
    assert forward.flash_attn == "auto"  # llama-bench writes -1


def test_bench_rows_refuse_what_is_not_a_forward_or_decode_steps():
    with pytest.raises(engines.EngineUnavailable, match="-pg"):
        engines.bench_rows(_report((4, 8, [1e6])))
    with pytest.raises(engines.EngineUnavailable, match="no JSON"):
        engines.bench_rows("error: failed to load model")
    with pytest.raises(engines.EngineUnavailable, match="no tests"):
        engines.bench_rows("[]")


def test_bench_reports_a_failing_llama_bench_with_its_stderr(tmp_path):
    exe = tmp_path / "llama-bench"
    exe.write_text(f"#!{sys.executable}\nimport sys\nprint('error: unknown model architecture', file=sys.stderr)\n"
                   "sys.exit(1)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    with pytest.raises(engines.EngineUnavailable, match="unknown model architecture"):
        engines.bench(model, [1, 2], executable=exe)
    with pytest.raises(engines.EngineUnavailable, match="make llama-cpp"):
        engines.bench(model, [1], executable=tmp_path / "nope")
    with pytest.raises(ValueError, match="positive widths"):
        engines.bench(model, [0, 1], executable=exe)
    with pytest.raises(ValueError, match="decode_tokens > 0"):
        engines.bench(model, (), decode_tokens=0, executable=exe)  # nothing to time


# ---- the real engine ------------------------------------------------------------------------------------------------

needs_llama = pytest.mark.skipif(not engines.built(), reason="llama-server is not built here (`make llama-cpp` "
                                 f"builds it; this machine lacks: {engines.missing_tools() or 'nothing'})")
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
           "Roses are red, violets are blue. Roses are red, violets are",
           "Write a short poem about the sea.",
           "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"]


@pytest.fixture(scope="module")
def target_gguf():
    from specrepro import models

    try:
        folder = models.target_dir(prepare=False)
    except models.ModelFilesMissing as e:
        pytest.skip(str(e))
    return engines.gguf(folder)


@pytest.mark.slow
@needs_llama
def test_llama_cpp_greedy_output_is_the_same_alone_and_under_concurrency_with_and_without_speculation(target_gguf):
    results = {}
    for name, spec in (("off", []), ("ngram", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"])):
        with engines.LlamaServer(target_gguf, spec=spec, parallel=4) as server:
            client = audit.Client(server.url)
            alone = audit.greedy(client, PROMPTS, max_tokens=24)
            together = audit.greedy(client, PROMPTS, max_tokens=24, concurrency=4)
            results[name] = (alone, together, audit.compare_outputs(alone, together))
    for name, (alone, _, _) in results.items():
        assert all(c.ids is not None and len(c.ids) > 0 for c in alone), name
    drafted = sum(c.drafted or 0 for c in results["ngram"][0])
    assert drafted > 0  # the n-gram mode did speculate on these repetitive prompts
    # speculation on, one at a time, writes what speculation off writes (greedy: lossless up to near-ties)
    across = audit.compare_outputs(results["off"][0], results["ngram"][0])
    assert across.prefix_match > 0.5
    assert results["off"][2].prompts == 4


@pytest.mark.slow
@needs_llama
def test_llama_bench_times_the_target_forward_by_width_and_its_decode_step(target_gguf):
    rows = engines.bench(target_gguf, [1, 4], depth=32, decode_tokens=4, repetitions=2)
    by = {(r.test, r.tokens): r for r in rows}
    assert set(by) == {("forward", 1), ("forward", 4), ("decode", 4)}
    assert all(r.depth == 32 and r.threads == 2 and len(r.samples_ms) == 2 and r.ms > 0 for r in rows)
    assert "F32" in by["forward", 1].model_type  # the float32 weights of our converted target
    (decode,) = engines.bench(target_gguf, (), depth=32, decode_tokens=4, repetitions=1)  # decode steps alone
    assert (decode.test, decode.tokens, decode.depth) == ("decode", 4, 32) and decode.ms > 0


@pytest.mark.slow
@needs_llama
def test_llama_cpps_own_speculation_is_timed_on_its_decode_against_its_own_autoregressive_decoding(target_gguf):
    from specrepro import bench, models

    tok = models.load_tokenizer(models.TARGET)
    repeating = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"  # greedy copies it on
    prompts = [tok(p).input_ids for p in (*PROMPTS, repeating)]
    rows, why = bench.llama_cpp_speculation(models.TARGET, prompts, max_new_tokens=24, threads=2,
                                            modes={"ngram n=3": bench.LLAMA_SPEC_MODES["ngram-simple 3-gram"]})
    assert why is None and [r["mode"] for r in rows] == ["ngram n=3"]
    r = rows[0]
    assert r["engine"] == "llama.cpp" and r["prompts"] == 5 and r["speedup"] > 0 and r["tokens"] > 0
    assert r["acceptance"] > 0  # the repeating prompt drafts, and its drafts are right
    assert r["prefix_match"] > 0.5  # greedy with speculation writes what greedy without it writes, up to near-ties
