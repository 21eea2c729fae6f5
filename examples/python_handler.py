#!/usr/bin/env python3
"""An exec handler on the gaffer_exec library: price quotes from a preloaded catalogue.

    [queues.quotes]
    handler = "exec"
    start = "fork"          # or "spawn": the same program runs either way
    command = ["python3", "examples/python_handler.py"]

The catalogue is loaded at import, before serve(): with start = "fork" that happens once
per host, in the queue's language zygote, and every slot's process shares it
copy-on-write; with "spawn" each slot loads its own copy.

    payload: {"sku": "SKU-000042", "quantity": 3, "currency": "USD"}
    result:  {"sku": "SKU-000042", "quantity": 3, "currency": "USD", "total": "1234.56"}

An unknown sku or currency fails the task (retrying would not help). Install the library
with `pip install ./sdk/python`; from a checkout this file also finds it in sdk/python.
"""

import json
import os
import sys

try:
    import gaffer_exec
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../sdk/python"))
    import gaffer_exec

RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.86, "CHF": 0.95}


def load_catalogue():
    """Prices in euro cents by sku: the JSON file named by QUOTES_CATALOGUE, or a generated
    demo catalogue of 200,000 items (about 30 MiB of Python objects)."""
    path = os.environ.get("QUOTES_CATALOGUE")
    if path:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    return {f"SKU-{n:06d}": 100 + (n * 7919) % 100_000 for n in range(200_000)}


CATALOGUE = load_catalogue()


def quote(payload):
    """One task's result entry, without its id."""
    if not isinstance(payload, dict):
        return {"status": "fail", "error": "the payload is not an object"}
    sku, currency = payload.get("sku"), payload.get("currency", "EUR")
    quantity = payload.get("quantity", 1)
    if sku not in CATALOGUE:
        return {"status": "fail", "error": f"unknown sku {sku!r}"}
    if currency not in RATES:
        return {"status": "fail", "error": f"unknown currency {currency!r}"}
    if not isinstance(quantity, int) or quantity < 1:
        return {"status": "fail", "error": f"quantity {quantity!r} is not a positive integer"}
    cents = round(CATALOGUE[sku] * quantity * RATES[currency])
    total = f"{cents // 100}.{cents % 100:02d}"
    return {"status": "ok", "result": {
        "sku": sku, "quantity": quantity, "currency": currency, "total": total}}


def handle(tasks):
    results = []
    for task in tasks:
        # Asked to stop (the queue shrinks, the host drains): the tasks not yet started go
        # back to the queue, no attempt counted.
        if gaffer_exec.should_stop():
            break
        results.append({"id": task["id"], **quote(task["payload"])})
    return results


if __name__ == "__main__":
    gaffer_exec.serve(handle)
