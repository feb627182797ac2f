"""Sharded verify runs: `--shard I/N` judges the I-th of N disjoint parts of a run, so N machines (a CI job matrix,
a Slurm job array) share one verify, and `flashcheck merge` puts their JSON files back together into one report and
one exit status (cases/report/merge.py).

Which shard a case belongs to depends on its stable id alone (the case's name for a catalogue instance, its source
text for a generated case), through a hash that is the same on every machine: no coordination, no scheduler, and a
case stays in its shard when others are added. Every case of the plan, skipped ones included, is in exactly one
shard, so the merged report lists each once.
"""
import hashlib

from flashcheck.cases.errors import UsageError


def parse(text):
    """(I, N) from "I/N" (1 <= I <= N), or None for None. Raises UsageError."""
    if text is None or isinstance(text, tuple):
        return text
    i, sep, n = str(text).partition("/")
    try:
        i, n = int(i), int(n)
    except ValueError:
        i = n = 0
    if not sep or not 1 <= i <= n:
        raise UsageError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return i, n


def owns(shard, key):
    """Whether the case with stable id `key` belongs to shard (I, N); every case does when shard is None."""
    if shard is None:
        return True
    i, n = shard
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % n == i - 1
