"""ThreadReuse (slicex/tls_xmlrpc.py): every connection gets a thread at once, threads are reused, idle ones
leave, and no job is lost or run twice around an idle thread's timeout."""

from __future__ import annotations

import threading
import time

from slicex.tls_xmlrpc import ThreadReuse


def _wait_for(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_every_job_gets_a_thread_at_once_even_when_all_block():
    """Kept-alive connections hold their thread: five jobs that each wait for all five must all run."""
    threads = ThreadReuse("t")
    barrier = threading.Barrier(5, timeout=5)
    done = []
    for _ in range(5):
        threads.submit(lambda: done.append(barrier.wait()))
    assert _wait_for(lambda: len(done) == 5)


def test_a_finished_thread_serves_the_next_job():
    threads = ThreadReuse("t")
    seen: list[int] = []
    threads.submit(lambda: seen.append(threading.get_ident()))
    assert _wait_for(lambda: len(seen) == 1 and threads._idle == 1)
    threads.submit(lambda: seen.append(threading.get_ident()))
    assert _wait_for(lambda: len(seen) == 2)
    assert seen[0] == seen[1]


def test_idle_threads_leave():
    threads = ThreadReuse("idle-leave", idle_seconds=0.05)
    threads.submit(lambda: None)
    assert _wait_for(lambda: threads._idle == 1)
    assert _wait_for(lambda: threads._idle == 0
                     and not any(t.name == "idle-leave" for t in threading.enumerate()))


def test_a_failing_job_does_not_end_its_thread():
    threads = ThreadReuse("t")
    threads.submit(lambda: 1 / 0)
    assert _wait_for(lambda: threads._idle == 1)
    ran = []
    threads.submit(lambda: ran.append(threading.get_ident()))
    assert _wait_for(lambda: ran)


def test_no_job_is_lost_or_run_twice_around_the_idle_timeout():
    """Submissions racing idle threads' timeouts (a timeout of a millisecond): each job runs exactly once."""
    threads = ThreadReuse("race", idle_seconds=0.001)
    counts = [0] * 3000
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            counts[i] += 1

    for i in range(len(counts)):
        threads.submit(lambda i=i: job(i))
        if i % 100 == 0:
            time.sleep(0.002)  # let idle threads time out between bursts
    assert _wait_for(lambda: sum(counts) == len(counts))
    assert set(counts) == {1}


def test_close_lets_the_idle_threads_leave_at_once():
    threads = ThreadReuse("closing", idle_seconds=60)
    barrier = threading.Barrier(3, timeout=5)
    for _ in range(3):
        threads.submit(barrier.wait)
    assert _wait_for(lambda: threads._idle == 3)
    threads.close()
    assert _wait_for(lambda: not any(t.name == "closing" for t in threading.enumerate()), seconds=2)
