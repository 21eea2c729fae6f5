"""The test driver's handler on gaffer_exec: what each task does is in its payload."""

import gc
import os
import time

import gaffer_exec

# A preload the fork tests can see shared: written, so its pages are dirty in the zygote.
PRELOAD = b"x" * (int(os.environ.get("GAFFER_TEST_PRELOAD_MIB", "0")) << 20)


def wait_for(check):
    """The handler's own polling of the library, bounded so a broken library fails a test
    instead of hanging it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def run(task):
    payload = task["payload"]
    action = payload.get("action", "ok")
    if action == "retry":
        return {"status": "retry", "delay_ms": payload["delay_ms"]}
    if action == "fail":
        return {"status": "fail", "error": payload["error"]}
    if action == "skip":
        return None
    if action == "raise":
        raise ValueError(payload["message"])
    if action == "unencodable":
        return {"status": "ok", "result": float("nan")}
    if action == "print":
        print(payload["message"])
        os.system(f"echo {payload['message']}-shell")
    if action == "info":
        return {"status": "ok", "result": {
            "pid": os.getpid(), "pgid": os.getpgid(0), "ppid": os.getppid(),
            "slot": os.environ.get("GAFFER_SLOT"), "queue": os.environ.get("GAFFER_QUEUE"),
            "start": os.environ.get("GAFFER_START"), "frozen": gc.get_freeze_count(),
            "preload": len(PRELOAD)}}
    if action == "wait_stop":
        print(f"waiting {task['id']}", flush=True)
        return {"status": "ok", "result": {"saw_stop": wait_for(gaffer_exec.should_stop)}}
    if action == "wait_cancel":
        if wait_for(lambda: gaffer_exec.cancelled(task["id"])):
            return {"status": "fail", "error": "cancelled"}
        return {"status": "ok"}
    return {"status": "ok"}


def handle(tasks):
    results = []
    for task in tasks:
        if gaffer_exec.should_stop():
            break
        result = run(task)
        if result is not None:
            results.append({"id": task["id"], **result})
    return results


gaffer_exec.serve(handle)
