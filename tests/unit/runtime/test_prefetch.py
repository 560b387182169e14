"""The prefetch thread keeps order and hands exceptions to the consumer."""

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
