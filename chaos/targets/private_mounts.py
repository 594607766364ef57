"""A target run's own /dev/shm and /tmp: a private mount namespace per run, so that what the
run leaves behind is exactly its own (attribution by place, never by name).

    observer (host mount namespace)                  driver pid (its own mount namespace)
    RunMounts.create()
      BASE = /dev/shm/.faultlab-run.pPID.XXXX  (host tmpfs; PID the observer's)
        BASE/shm    ◄──────── bind ─────────────────  /dev/shm        (fresh, empty)
        BASE/upper  ◄──────── overlay upper ────────  /tmp = host /tmp (read) + BASE/upper
        BASE/work             overlay's work dir        (every write of the run)
    wrap(argv, keep)  ──► python -I -S private_mounts.py BASE KEEP... -- ARGV...
                            unshare(CLONE_NEWNS); mount --make-rprivate /
                            overlay on /tmp; each KEEP dir bound back to the host's own
                            (the out dir: what the driver writes there the observer reads);
                            BASE/shm bound on /dev/shm; chdir again; exec ARGV (same pid)
    shm_names()       every name in BASE/shm: the run's, and only the run's
    tmp_paths(globs)  files of BASE/upper matching the target's /tmp temp_globs, as the run
                      named them (/tmp/...)
    remove()          BASE and everything in it: the run's leftovers go with it
    sweep_stale()     the BASEs of observers that are gone (SIGKILLed: no remove() ran)

Why a host directory rather than reading /proc/<driver>/root/dev/shm: the namespace ends with
its last process, and a run whose driver is SIGKILLed may have no process left by the time
the observer looks; BASE lives on until the observer removes it, so leftovers are seen
whatever ended the run.  /tmp is an overlay rather than a fresh tmpfs: the run still reads the
host's /tmp (its own out dir and scripts, torch's inductor cache) while every file it creates
or changes lands in BASE/upper.  What the run writes to /tmp caches is dropped with the run.

Invariants: the launcher execs the driver in place (the pid the observer started is the
driver's); it imports nothing but the standard library (it runs with ``-I -S`` before any
target's interpreter); when namespaces cannot be had (not root, no overlay, a seccomp
profile) ``unavailable()`` says why in one line and the observer falls back to attribution
by name.  BASE's name carries no pid between underscores, so a fallback run of the old kind
never takes it for a segment of its own; a BASE whose observer pid is gone (an observer
SIGKILLed) is removed by the next run's ``create`` (``sweep_stale``).
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile

SHM = "/dev/shm"
TMP = "/tmp"
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_PROBE_TIMEOUT_S = 30.0
_PREFIX = ".faultlab-run.p"  # then the observer's pid: BASE = /dev/shm/.faultlab-run.pPID.XXXX
_probe: list[str | None] = []  # the one probe's answer, once asked (None: available)


class RunMounts:
    """BASE on the host for one run; see the module docstring."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.shm_dir = os.path.join(base, "shm")
        self.upper = os.path.join(base, "upper")
        for sub in (self.shm_dir, self.upper, os.path.join(base, "work")):
            os.makedirs(sub, exist_ok=True)

    @classmethod
    def create(cls) -> RunMounts:
        sweep_stale()
        return cls(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}.", dir=SHM))

    def wrap(self, argv: list[str], keep: list[str]) -> list[str]:
        """``argv`` started inside the run's namespace; ``keep``: host dirs (under /tmp)
        the run must reach as they are (its out dir, its cwd)."""
        dirs = sorted({os.path.realpath(d) for d in keep if _under(os.path.realpath(d), TMP)})
        return [sys.executable, "-I", "-S", os.path.abspath(__file__), self.base, *dirs,
                "--", *argv]

    def shm_names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.shm_dir))
        except OSError:
            return []

    def tmp_paths(self, globs: tuple[str, ...] | list[str]) -> list[str]:
        """Files the run created under /tmp that match one of ``globs`` (paths as it saw
        them); overlay whiteouts (the run deleted a host file) are not files."""
        mine = [g for g in globs if _under(g, TMP)]
        found = []
        for root, dirs, files in os.walk(self.upper):
            for name in dirs + files:
                path = os.path.join(root, name)
                seen = TMP + path[len(self.upper):]
                if any(_glob_match(seen, g) for g in mine) and not _whiteout(path):
                    found.append(seen)
        return sorted(found)

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def sweep_stale() -> list[str]:
    """Remove the BASE of every run whose observer is gone (one SIGKILLed has no clean-up);
    returns what it removed.  A live pid keeps its BASE, whoever holds that pid now."""
    removed = []
    for name in os.listdir(SHM):
        owner = name[len(_PREFIX):].split(".")[0] if name.startswith(_PREFIX) else ""
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            shutil.rmtree(os.path.join(SHM, name), ignore_errors=True)
            removed.append(name)
    return removed


def tmp_glob(pattern: str) -> bool:
    """True when the run's private places cover ``pattern`` (a target's temp_glob)."""
    return _under(pattern, TMP) or _under(pattern, SHM)


def unavailable() -> str | None:
    """None when a run can have its own namespace here; else one line saying why not.
    Probed once per process: the launcher is run on a scratch BASE with ``true``."""
    if not _probe:
        _probe.append(_ask_probe())
    return _probe[0]


def _ask_probe() -> str | None:
    if os.geteuid() != 0:
        return "not root: no private mount namespace"
    mounts, kept = RunMounts.create(), tempfile.mkdtemp(prefix="faultlab-probe.", dir=TMP)
    try:  # every step a run takes: overlay, a dir kept, /dev/shm
        done = subprocess.run(mounts.wrap(["true"], [kept]), capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the namespace launcher did not run: {exc}"
    finally:
        mounts.remove()
        os.rmdir(kept)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return None


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _glob_match(path: str, pattern: str) -> bool:
    """``glob.glob``'s sense: a ``*`` never crosses a ``/``."""
    return path.count("/") == pattern.count("/") and fnmatch.fnmatch(path, pattern)


def _whiteout(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return True
    return st.st_rdev == 0 and (st.st_mode & 0o170000) == 0o020000  # char device 0/0


# ---------------------------------------------------------------- inside: the launcher


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)  # the running program's libc
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _libc_call("mount", enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])


def enter(base: str, keep: list[str]) -> None:
    """Unshare the mount namespace and set the run's /tmp and /dev/shm up (see above)."""
    cwd = os.getcwd()
    _libc_call("unshare", _CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    # Held open in the new namespace (a bind's source must be one of its own mounts),
    # before the overlay hides the host's /tmp.
    held = [(d, os.open(d, os.O_PATH | os.O_DIRECTORY)) for d in keep]
    options = f"lowerdir={TMP},upperdir={base}/upper,workdir={base}/work"
    _mount("overlay", TMP, "overlay", 0, options)
    for path, fd in held:
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)
    _mount(f"{base}/shm", SHM, None, _MS_BIND)
    os.chdir(cwd)  # a cwd under /tmp: resolved again, through the new mounts


def main(args: list[str]) -> None:
    split = args.index("--")
    base, keep, argv = args[0], args[1:split], args[split + 1:]
    try:
        enter(base, keep)
    except OSError as exc:
        print(f"faultlab private_mounts: no private /tmp and /dev/shm: {exc}", file=sys.stderr)
        sys.exit(125)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
