"""scripts/bench-exec's Celery side: Redis as broker, no result backend (every task
ignores its result, no events sent), so a task costs Celery's broker work only.
BENCH_REFDATA=1 imports refdata (200 MiB) here, in the worker's main process, before
the prefork pool forks its children: Celery's own way to share it."""

import os
import sys

from celery import Celery

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchtask  # noqa: E402

if os.environ.get("BENCH_REFDATA") == "1":
    import refdata  # noqa: E402

app = Celery("bench", broker=os.environ["BENCH_REDIS_URL"])
app.conf.update(
    result_backend=None,
    task_ignore_result=True,
    task_send_sent_event=False,
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="lookup")
def lookup():
    refdata.lookup()
    benchtask.touched("lookup")


@app.task(name="scan")
def scan():
    refdata.scan()
    benchtask.touched("scan")


@app.task(name="noop")
def noop():
    benchtask.done(1)
