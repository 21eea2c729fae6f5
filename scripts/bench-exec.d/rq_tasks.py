"""scripts/bench-exec's RQ job: a no-op that counts itself (benchtask.done)."""

import benchtask


def noop():
    benchtask.done(1)
