"""Reference data loaded at import, as a real handler module would: scripts/bench-exec's
stand-in for a product catalogue, a tariff table, a model's vocabulary.

Plain Python, no gaffer, Celery or RQ in it: the same module is imported by the gaffer
exec handler, by Celery's worker and by the one-process reference. It builds a dict of
REFDATA_MIB (default 200) MiB of ordinary Python objects, about 450 bytes a record
(CPython 3.11): a str key, a 4-tuple holding an int, a float, a str and a 2-tuple of ints.
Objects, not one bytes blob, because that is what reference data becomes once parsed, and
because objects are what copy-on-write sharing loses to: reading an object writes its
reference count, and a garbage collection writes the header of every container it visits.
The records are computed, not read from a file, so every run has the same data without a
fixture; the build costs about what parsing a file of it would (1-2 s here).
"""

import os
import random

RECORD_BYTES = 450  # measured: RSS growth per record on CPython 3.11, x86-64
MIB = int(os.environ.get("REFDATA_MIB", "200"))
RECORDS = MIB * (1 << 20) // RECORD_BYTES


def _build(n):
    out = {}
    for i in range(n):
        h = (i * 2654435761) % 4294967296
        out["sku-%08d" % i] = (
            i + 1000,
            (h % 100000) / 100.0,
            "item %010d %s" % (h, "abcdefgh"[i % 8] * (i % 17)),
            (h % 997 + 300, h % 65521 + 300),
        )
    return out


CATALOGUE = _build(RECORDS)


def lookup(n=1000):
    """A task that uses the data as reference data is used: n records by key, at random
    (their price and category)."""
    rnd = random.Random()
    total, cats = 0.0, 0
    for _ in range(n):
        record = CATALOGUE["sku-%08d" % rnd.randrange(RECORDS)]
        total += record[1]
        cats += record[3][0]
    return total, cats


def scan():
    """The worst case: a task that reads every record (its price and category), so every
    page of the objects it reads is written once by reference counting."""
    total, cats = 0.0, 0
    for record in CATALOGUE.values():
        total += record[1]
        cats += record[3][0]
    return total, cats
