"""``manage.py cogworker ACTION``: look at and act on queues, sets, processes, periodic entries, batches,
limiters, jobs (cancel), the metrics history (metrics; mark) and profiles.

The edge only: arguments in, ``cli.listings`` / ``cli.actions`` (through ``api``), text out.
Exit codes: 0 done; 1 something named isn't there or was refused (the rest was done); 2 a
usage error (argparse's own code; a bulk or destructive action without ``--yes``).

Checks: as few as the action needs (``cli.checks``): none for ``genkey``, the settings a listing
reads for a listing, every system check for an action that changes something.
"""

from __future__ import annotations

import argparse
import os

import redis
from django.core.management.base import BaseCommand, CommandError

from ...cli import actions, checks, listings
from ...cli.output import FAILED, USAGE, as_json, table

LISTINGS = ("stats", "queues", "groups", "processes", "busy", "scheduled", "retries", "dead", "periodic", "batches",
            "limits", "outbox", "metrics", "profiles")


def _limit(text: str) -> int:
    from ... import api

    value = int(text)
    if not 1 <= value <= api.MAX_PER_PAGE:
        raise argparse.ArgumentTypeError(f"must be from 1 to {api.MAX_PER_PAGE} (use --page for more)")
    return value


def _minutes(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 30 * 24 * 60:
        raise argparse.ArgumentTypeError("must be from 1 to 43200 (30 days)")
    return value


def _page(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


class Command(BaseCommand):
    help = ("Look at and act on cogworker: stats, queues, processes, busy, scheduled, retries, dead, periodic, "
            "batches, limits, outbox, metrics, profiles; pause/unpause and clear queues; retry/delete and cancel jobs; "
            "quiet/stop processes; mark a deploy on the metrics history; genkey prints a key for ENCRYPTION_KEYS.")
    # Run by handle, as each action needs (cli/checks.py): all of them first locked out genkey and
    # the listings whenever a check failed, E020's "run `cogworker genkey`" included.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        # (Django adds --skip-checks only to a command that asks for checks. Each action's own parser
        # takes it too: after the action's name, it was refused. SUPPRESS there: not given after the
        # name, it leaves the value given before it.)
        parser.add_argument("--skip-checks", action="store_true", help="skip the system checks")
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument("--skip-checks", action="store_true", default=argparse.SUPPRESS,
                            help="skip the system checks (an action that changes something runs them all)")
        sub = _Subparsers(parser.add_subparsers(dest="action", required=True, metavar="ACTION"), common)
        listing = argparse.ArgumentParser(add_help=False)
        listing.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
        paged = argparse.ArgumentParser(add_help=False)
        paged.add_argument("--limit", type=_limit, default=25, help="rows per page (default 25, at most 100)")
        paged.add_argument("--page", type=_page, default=1, help="the page to show, from 1")

        sub.add_parser("stats", parents=[listing], help="counters, sizes and processes at a glance")
        p = sub.add_parser("queues", parents=[listing, paged], help="queues: size, latency, paused")
        p.add_argument("names", nargs="*", metavar="QUEUE", help="only these (each must exist)")
        p = sub.add_parser("groups", parents=[listing, paged], help="a queue's groups, the busiest first: jobs "
                                                                     "waiting, paused")
        p.add_argument("queue", metavar="QUEUE")
        sub.add_parser("processes", parents=[listing, paged], help="live worker processes")
        sub.add_parser("busy", parents=[listing, paged], help="the jobs running now, each with its progress")
        for kind, what in (("scheduled", "jobs due later"), ("retries", "failed jobs waiting for a retry"),
                           ("dead", "jobs that won't run again, the latest first")):
            p = sub.add_parser(kind, parents=[listing, paged], help=what)
            p.add_argument("--class", dest="job", metavar="JOB", help="only jobs of this class (dotted name)")
            p.add_argument("--grep", metavar="TEXT", help="only entries whose stored JSON contains TEXT")
        sub.add_parser("periodic", parents=[listing, paged], help="periodic entries: last and next run")
        p = sub.add_parser("batches", parents=[listing, paged], help="batches, the newest first; with a BID, that "
                                                                      "batch: its jobs, callbacks and child batches")
        p.add_argument("bid", nargs="?", metavar="BID", help="one batch")
        sub.add_parser("outbox", parents=[listing], help="the transactional outbox of each database: jobs waiting "
                                                         "to reach Redis, the oldest's age")
        sub.add_parser("limits", parents=[listing, paged], help="limiter keys, the most recently used first: in "
                                                                 "use, holders, refusals, reschedules")
        p = sub.add_parser("metrics", parents=[listing], help="the metrics history: per job class, runs, failures, "
                                                              "run time and its p50/p95/p99, over the last minutes")
        p.add_argument("--minutes", type=_minutes, default=60, help="the window (default 60; over 360 read by the "
                                                                    "hour; at most 43200, 30 days)")
        p.add_argument("--class", dest="job", metavar="NAME", help="only this job class (dotted name)")
        p = sub.add_parser("profiles", parents=[listing, paged], help="jobs run under a profiler on request, the "
                                                                       "newest first; 'profiles show ID': one's top "
                                                                       "functions")
        p.add_argument("show", nargs="?", choices=["show"], help="show one profile")
        p.add_argument("ident", nargs="?", metavar="ID", help="the profile's id (from the list)")

        for verb, what in (("pause", "no process fetches from these queues"), ("unpause", "fetch from them again"),
                           ("resume", "fetch from them again (as unpause)")):
            p = sub.add_parser(verb, help=f"{verb} queues: {what} (from each process's next heartbeat); with "
                                          f"--group, groups of one queue (at once)")
            p.add_argument("names", nargs="+", metavar="QUEUE")
            p.add_argument("--force", action="store_true", help=f"{verb} a queue nothing was pushed to yet")
            p.add_argument("--group", action="append", dest="groups", metavar="GROUP",
                           help=f"{verb} this group of the queue instead (repeat for more)")
        p = sub.add_parser("clear", help="delete every waiting job of queues")
        p.add_argument("names", nargs="+", metavar="QUEUE")
        p.add_argument("--yes", action="store_true", help="confirm")
        for verb in ("retry", "delete"):
            p = sub.add_parser(verb, help=f"{verb} jobs of the scheduled, retry or dead set"
                                          + (" (enqueue them now)" if verb == "retry" else ""))
            p.add_argument("set", choices=list(listings.SETS), metavar="SET", help="scheduled, retries or dead")
            p.add_argument("jids", nargs="*", metavar="JID", help="a jid, or an entry's token from --json")
            p.add_argument("--all", action="store_true", dest="every", help="every entry of the set")
            p.add_argument("--yes", action="store_true", help="confirm (needed by --all and by delete)")
        p = sub.add_parser("cancel", help="cancel a job: take it off its queue, the schedule or the retries; "
                                          "a running one is asked to stop")
        p.add_argument("jid", metavar="JID")
        p.add_argument("--interrupt", action="store_true", help="a running job: raise Cancelled in its thread "
                                                                 "instead of asking it to stop")
        p = sub.add_parser("mark", help='mark now in the metrics history ("deploy 1.4.2"): a line on its charts')
        p.add_argument("label", metavar="LABEL")
        sub.add_parser("genkey", help="print a new key for COGWORKER['ENCRYPTION_KEYS'] (32 random bytes, URL-safe "
                                      "base64); nothing is stored or sent")
        for verb in ("quiet", "stop"):
            p = sub.add_parser(verb, help={"quiet": "stop fetching (finish running jobs, stay up)",
                                           "stop": "shut down as on TERM"}[verb] + " at the next heartbeat")
            p.add_argument("identities", nargs="*", metavar="IDENTITY")
            p.add_argument("--all", action="store_true", dest="every", help="every live process")

    def handle(self, *args, action, **options):
        if action == "genkey":  # (needs neither Redis nor the settings: checks nothing)
            from ...features.encryption.keys import new_key

            self.stdout.write(new_key())
            return
        try:
            if action in LISTINGS:
                return self._read(action, options)
            if not options["skip_checks"]:
                self.check()
            outcome = self._act(action, options)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise CommandError(f"can't reach Redis: {exc}", returncode=FAILED) from None
        for line in outcome.done:
            self.stdout.write(line)
        if outcome.failed:
            raise CommandError("\n".join(outcome.failed), returncode=FAILED)

    def _read(self, action: str, options: dict) -> None:
        """Show a listing, having checked only the settings it reads (cli/checks.py)."""
        from django.conf import settings

        from ...push import runtime

        config, set_aside = checks.reading_config(getattr(settings, "COGWORKER", None), os.environ)
        if not set_aside:
            return self._show(action, options)
        self.stderr.write(checks.set_aside_note(set_aside))
        runtime.use_config(config)
        try:
            return self._show(action, options)
        finally:
            runtime.reset()

    def _show(self, action: str, options: dict) -> None:
        if action == "stats":
            shown = listings.stats()
        elif action == "queues":
            shown = listings.queues(options["names"], options["page"], options["limit"])
        elif action == "groups":
            from ...features.fairness.cli import groups

            shown = groups(options["queue"], options["page"], options["limit"])
        elif action == "processes":
            shown = listings.processes(options["page"], options["limit"])
        elif action == "busy":
            shown = listings.busy(options["page"], options["limit"])
        elif action == "periodic":
            shown = listings.periodic(options["page"], options["limit"])
        elif action == "limits":
            shown = listings.limits(options["page"], options["limit"])
        elif action == "metrics":
            from ...features.history.cli import listing as history_listing

            shown = history_listing(options["minutes"], options["job"])
        elif action == "profiles":
            from ...features.profiling import cli as profiling_cli

            if bool(options["show"]) != bool(options["ident"]):
                raise CommandError("usage: cogworker profiles [show ID]", returncode=USAGE)
            shown = (profiling_cli.show(options["ident"]) if options["show"]
                     else profiling_cli.listing(options["page"], options["limit"]))
        elif action == "outbox":
            from ...outbox.cli import listing as outbox_listing

            shown = outbox_listing()
        elif action == "batches":
            shown = listings.batch(options["bid"]) if options["bid"] else listings.batches(options["page"],
                                                                                           options["limit"])
        else:
            shown = listings.sorted_set(action, options["page"], options["limit"], options["job"], options["grep"])
        if options["json"]:
            self.stdout.write(as_json(shown.document))
            return
        self.stdout.write(table(shown.headers, shown.rows))
        for headers, rows in shown.sections:
            self.stdout.write("")
            self.stdout.write(table(headers, rows))
        if shown.note:
            self.stderr.write(shown.note)

    def _act(self, action: str, options: dict) -> actions.Outcome:
        if action in ("pause", "unpause", "resume") and options["groups"]:
            from ...features.fairness.cli import pause as pause_groups

            if len(options["names"]) != 1:
                raise CommandError(f"usage: cogworker {action} QUEUE --group GROUP (one queue)", returncode=USAGE)
            return pause_groups(options["names"][0], options["groups"], resume=action != "pause")
        if action in ("pause", "unpause", "resume"):
            return actions.pause(options["names"], unpause=action != "pause", force=options["force"])
        if action == "clear":
            return actions.clear(options["names"], yes=options["yes"])
        if action in ("retry", "delete"):
            return actions.on_entries(options["set"], options["jids"], delete=action == "delete",
                                      every=options["every"], yes=options["yes"])
        if action == "cancel":
            return actions.cancel(options["jid"], interrupt=options["interrupt"])
        if action == "mark":
            from ...features.history.cli import mark

            return mark(options["label"])
        if action in ("quiet", "stop"):
            return actions.signal(action, options["identities"], every=options["every"])
        raise CommandError(f"unknown action {action!r}", returncode=USAGE)


class _Subparsers:
    """``add_subparsers()``'s action, each parser it adds given ``common``'s options (--skip-checks)."""

    def __init__(self, action: argparse._SubParsersAction, common: argparse.ArgumentParser):
        self.action, self.common = action, common

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        kwargs["parents"] = [*kwargs.get("parents", ()), self.common]
        return self.action.add_parser(name, **kwargs)
