"""The compile-once cache manager (cases/runner/compile_once.py): of several processes (threads here: the lock is an
flock on a file, so two opens of it exclude each other alike) that miss one key at once, one compiles and the others
wait, then load what it stored; a compile that stores nothing holds no one up past release() or WAIT."""
import threading
import time

import pytest

once = pytest.importorskip("flashcheck.cases.runner.compile_once")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    return tmp_path


def _in_thread(fn):
    box = {}

    def run():
        box["result"] = fn()
        box["at"] = time.monotonic()
    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_a_second_process_waits_for_the_first_compile_and_loads_it(cache_dir):
    first = once.CompileOnce("KEY")
    assert first.get_group("k.json") is None                 # a miss: this one compiles, holding the key
    waiter, box = _in_thread(lambda: once.CompileOnce("KEY").get_group("k.json"))
    time.sleep(0.3)
    assert waiter.is_alive(), "the second compile of the key did not wait for the first"
    path = first.put(b"binary", "k.cubin")
    stored = time.monotonic()
    first.put_group("k.json", {"k.cubin": path})
    waiter.join(5)
    assert box["result"] == {"k.cubin": path} and box["at"] >= stored


def test_a_compile_that_stores_nothing_lets_the_waiter_compile_after_release(cache_dir):
    failed = once.CompileOnce("KEY")
    assert failed.get_group("k.json") is None
    waiter, box = _in_thread(lambda: once.CompileOnce("KEY").get_group("k.json"))
    time.sleep(0.3)
    assert waiter.is_alive()
    once.release()                                           # what flashcheck does after each case
    waiter.join(5)
    assert not waiter.is_alive() and box["result"] is None   # nothing stored: it compiles on its own


def test_a_waiter_gives_up_after_wait_seconds(cache_dir, monkeypatch):
    monkeypatch.setattr(once, "WAIT", 0.2)
    assert once.CompileOnce("KEY").get_file("launcher.so") is None
    started = time.monotonic()
    waiter, box = _in_thread(lambda: once.CompileOnce("KEY").get_file("launcher.so"))
    waiter.join(5)
    assert box["result"] is None and 0.2 <= box["at"] - started < 3
    once.release()


def test_other_keys_and_hits_never_wait(cache_dir):
    holder = once.CompileOnce("KEY")
    assert holder.get_group("k.json") is None
    other, box = _in_thread(lambda: once.CompileOnce("OTHER").get_group("k.json"))
    other.join(2)
    assert not other.is_alive() and box["result"] is None
    path = holder.put(b"x", "k.cubin")
    holder.put_group("k.json", {"k.cubin": path})
    assert once.CompileOnce("KEY").get_group("k.json") == {"k.cubin": path}   # a hit takes no lock
    once.release()
