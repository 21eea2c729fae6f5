#!/usr/bin/env python3
"""The demo's photo resizer (config.toml's `resize_photo`, `start = "fork"`), on gaffer_exec.

What it loads at import (here a stand-in for an imaging library's colour tables) is loaded
once per host, in the queue's language zygote; every slot's process is forked from it and
shares those pages copy-on-write. With `start = "spawn"` the same file runs unchanged, each
slot's process loading its own copy.

    payload: {"photo": 1, "size": "small"}       -> ok, result {"photo": 1, "size": "small"}
    payload: {"action": "sleep", "ms": 100}      -> sleeps, then ok (the demo load sends it)

Install the library with `pip install ./sdk/python`; from a checkout this file also finds
it in sdk/python.
"""

import os
import sys
import time

try:
    import gaffer_exec
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../sdk/python"))
    import gaffer_exec

# About 8 MiB of tables, built once per host in fork mode.
PROFILES = {f"profile-{n}": bytes(range(256)) * 16 for n in range(2000)}


def resize(payload):
    """One task's result entry, without its id."""
    if not isinstance(payload, dict):
        return {"status": "ok"}
    if payload.get("action") == "sleep":
        time.sleep(payload.get("ms", 0) / 1000)
    size = payload.get("size", "original")
    profile = PROFILES[f"profile-{hash(size) % len(PROFILES)}"]
    return {"status": "ok", "result": {"photo": payload.get("photo"), "size": size,
                                       "profile_bytes": len(profile)}}


def handle(tasks):
    results = []
    for task in tasks:
        # Asked to stop (the queue shrinks, the host drains): the tasks not yet started go
        # back to the queue, no attempt counted.
        if gaffer_exec.should_stop():
            break
        results.append({"id": task["id"], **resize(task["payload"])})
    return results


if __name__ == "__main__":
    gaffer_exec.serve(handle)
