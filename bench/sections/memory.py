"""Memory: the resident set of one cogworker process (``runcogworker -c 10``, reliable fetch, the
bench project) idle (the idle section measures it), after the drain section's drain, and, with
``--full``, after draining 1,000,000 jobs.

Writes ``memory`` (``cogworker_after_<N>_mb``; the idle section's ``cogworker_idle_mb``) and, with
--full, ``drain_1m``.
"""

from __future__ import annotations

from typing import Any

from markdown import Page, table
from session import Bench
from systems import Cogworker

NAME = "memory"
QUICK = True


def run(bench: Bench) -> None:
    mem = bench.results.setdefault("memory", {})
    base = bench.results.get("drain", {}).get("cogworker-reliable-c10")
    if base and "rss_mb_after" in base:
        mem[f"cogworker_after_{base['n']}_mb"] = base["rss_mb_after"]
    if bench.args.full:
        res = bench.drain(Cogworker("reliable", 10), 1_000_000, latency=False, idle=False)
        mem["cogworker_after_1000000_mb"] = res["rss_mb_after"]
        bench.results["drain_1m"] = res


def report(res: dict[str, Any]) -> str:
    mem = res.get("memory", {})
    if not mem:
        return ""
    page = Page()
    add = page.add
    add("## Memory")
    add("")
    add("Resident set size of one cogworker process (`runcogworker -c 10`, reliable fetch, the bench "
        "project: Django with admin, auth, sessions, messages and cogworker loaded).")
    add("")
    rows = []
    for k, x in mem.items():
        what = ("idle, after start-up" if k.endswith("idle_mb") else
                f"after draining {int(k.split('_')[2]):,} jobs")
        rows.append([what, x])
    if "cogworker_after_1000000_mb" not in mem:
        rows.append(["after draining 1,000,000 jobs", "(`--full` only)"])
    add(table(["cogworker process", "RSS MB"], rows))
    add("")
    return page.text()
