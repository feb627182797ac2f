"""The suite's own order under pytest-xdist (conftest.py): the long tests are dealt to the front of every worker's
first part, so no worker is handed a queue of them while the others run short ones."""
import conftest


def test_long_tests_are_dealt_to_the_front_of_every_workers_part():
    n_long, n_short, workers = 7, 30, 3
    items = [f"short{i}" for i in range(n_short)] + [f"long{i}" for i in range(n_long)]
    rank = lambda it: 0 if it.startswith("long") else len(conftest._LONG_FIRST)       # noqa: E731
    out = conftest.dealt(items, rank, workers)
    assert sorted(out) == sorted(items)
    parts, start = [], 0
    for size in conftest.first_parts(len(out), workers):
        parts.append(out[start:start + size])
        start += size
    assert [len(p) for p in parts] == [12, 12, 13]
    for i, part in enumerate(parts):
        longs = [it for it in part if it.startswith("long")]
        assert longs == [f"long{j}" for j in range(i, n_long, workers)]       # round-robin, in rank order
        assert part[:len(longs)] == longs                                       # at the front of the part
    assert [it for it in out if it.startswith("short")] == [f"short{i}" for i in range(n_short)]
    assert conftest.dealt(items, rank, 1) == sorted(items, key=rank)            # one worker: long first, that is all


def test_long_tests_named_to_share_one_worker_are_dealt_as_one_in_their_order():
    """one_worker(name): the fp32 precision shards of one kernel path go to one worker's part, one after the other
    (each after the first finds most of its compiles in the cache), not one to each worker at once."""
    items = [f"short{i}" for i in range(20)] + ["a1", "b1", "a2", "b2", "solo", "a3"]
    rank = lambda it: len(conftest._LONG_FIRST) if it.startswith("short") else 0        # noqa: E731
    together = lambda it: it[0] if it[0] in "ab" else None                              # noqa: E731
    out = conftest.dealt(items, rank, 3, together)
    assert sorted(out) == sorted(items)
    parts, start = [], 0
    for size in conftest.first_parts(len(out), 3):
        parts.append(out[start:start + size])
        start += size
    assert [p[:3] for p in parts] == [["a1", "a2", "a3"], ["b1", "b2", "short5"], ["solo", "short12", "short13"]]

