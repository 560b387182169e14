"""The prefetch thread keeps order and hands exceptions to the consumer."""

import threading

import pytest

from rlkube.runtime.data.prefetch import Prefetcher


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_order_is_kept(depth):
    assert list(Prefetcher(lambda x: x * 10, range(7), depth)) == [0, 10, 20, 30, 40, 50, 60]


def test_exception_reaches_the_consumer_at_its_item():
    def make(x):
        if x == 2:
            raise KeyError("boom")
        return x

    got = []
    with pytest.raises(KeyError):
        for v in Prefetcher(make, range(5), depth=2):
            got.append(v)
    assert got == [0, 1]


def test_consumer_may_stop_early():
    it = iter(Prefetcher(lambda x: x, range(100), depth=2))
    assert next(it) == 0
    it.close()  # the producer thread is released, nothing hangs


def test_start_prepares_before_the_consumer_asks():
    made = threading.Event()

    def make(x):
        made.set()
        return x

    fetch = Prefetcher(make, range(3), depth=1).start()
    assert made.wait(timeout=10)  # bounded: the thread runs on its own
    assert list(fetch) == [0, 1, 2]


def test_a_started_prefetcher_that_is_never_consumed_closes():
    fetch = Prefetcher(lambda x: x, range(100), depth=2).start()
    fetch.close()
    assert not fetch._thread.is_alive()


def test_a_prefetcher_is_iterated_once():
    fetch = Prefetcher(lambda x: x, range(3), depth=1)
    assert list(fetch) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="iterated once"):
        list(fetch)
