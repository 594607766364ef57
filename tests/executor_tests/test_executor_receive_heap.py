"""Large replies received into a warm heap (issue 23): no page faults once warm, no mallopt.

A fresh driver (a subprocess: this test process's heap is already warm from other tests)
reads 1 MiB ``bytes`` replies of two ranks through the real queue reader, keeping each
call's replies alive until the next call's arrive, as a caller's loop does.  Cold, glibc
trims the heap top every other call and every page of a reply faults again (~256 faults
per 1 MiB); warmed by ``serialization._warm_heap``, the count stays near zero.  Page
faults are counted (``ru_minflt``), never timed.  A user's explicit ``mallopt`` turns
glibc's dynamic thresholds off, and the warm-up then changes nothing: checked too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

DRIVER = textwrap.dedent("""
    import ctypes, os, resource, sys
    from executor.serialization import decode, encode
    from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer
    from executor.protocol import REPLY_OK

    if sys.argv[1] == "user-mallopt":  # M_MMAP_THRESHOLD at glibc's start value, set explicitly
        ctypes.CDLL(None).mallopt(-3, 128 << 10)
    rings = [ShmRingBuffer(QueueSpec(f"heap{r}", 1, 4, 1 << 20)) for r in range(2)]
    writers = [QueueWriter(ring, [], None) for ring in rings]
    readers = [QueueReader(ring, 0, None, None) for ring in rings]
    payload = os.urandom(1 << 20)

    def call():
        got = []
        for w, r in zip(writers, readers):
            w.write(1, encode(REPLY_OK, 0, payload), None)
            got.append(decode(r.read(5.0)[1]))
        return got

    got = call()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        got = call()
        assert got[0] == payload and got[1] == payload
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 40)
    del got
    for ring in rings:
        ring.close()
""")


def _driver_faults_per_call(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", DRIVER, mode], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])


def test_a_warm_driver_takes_no_page_faults_for_1mib_replies() -> None:
    # The reader's writes fault at most a few pages per call (the frame, the pickle); cold,
    # the two replies alone fault ~256 pages per call on average.
    assert _driver_faults_per_call("default") < 40


def test_an_explicit_mallopt_of_the_user_stays_in_force() -> None:
    # glibc ignores freed-chunk sizes once the user set a threshold: replies stay mmapped
    # and fault every page, as the user's setting says (nothing here overrode it).
    assert _driver_faults_per_call("user-mallopt") > 200
