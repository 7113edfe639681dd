from django.core.management.base import BaseCommand

from django_cogworker import Batch, cancel, chain
from django_cogworker.push import runtime
from testproject.demo.async_jobs import AsyncSleepJob
from testproject.demo.collapse_jobs import DebouncedJob
from testproject.demo.fair_jobs import RankJob, TurnJob
from testproject.demo.flow_jobs import PartnerCallJob
from testproject.demo.jobs import FlakyJob, ReceiptsSent, ScheduledHello, SendReceipt, Tally


class Command(BaseCommand):
    help = ("Enqueue the demo jobs: a SendReceipt, a FlakyJob (succeeds on retry), a ScheduledHello in 5 s, "
            "a batch of three SendReceipts with a success callback, a chain of two steps, six PartnerCallJobs "
            "limited to three at once, a ScheduledHello cancelled before it runs, twenty async jobs that await "
            "0.5 s together on the event loop, five debounced pushes that run once, and a customer's 40 jobs that "
            "take turns with another's 3 (groups) behind an urgent one (priority).")

    def handle(self, *args, **options):
        jids = {
            "SendReceipt": SendReceipt.perform_async(1),
            "FlakyJob": FlakyJob.perform_async(),
            "ScheduledHello (in 5 s)": ScheduledHello.perform_in(5, "cogworker"),
        }
        for name, jid in jids.items():
            self.stdout.write(f"enqueued {name}: {jid}")
        batch = Batch(description="demo: three receipts").on("success", ReceiptsSent, orders=[2, 3, 4])
        with batch.jobs():
            for order_id in (2, 3, 4):
                SendReceipt.perform_async(order_id)
        self.stdout.write(f"enqueued a batch of 3 SendReceipts with a success callback: bid {batch.bid}")
        flow = chain(Tally.s(2), Tally.s(3).with_previous()).perform_async(description="demo: a chain")
        self.stdout.write(f"enqueued a chain Tally(2) -> Tally(3, previous): bid {flow.bid}")
        # (Its counters under the config's prefix: make demo writes no key outside its own.)
        partner = PartnerCallJob.perform_bulk([[f"{runtime.get_config().key_prefix}partner-calls", 0.5]] * 6)
        self.stdout.write(f"enqueued {len(partner)} PartnerCallJobs of 0.5 s, at most 3 at once (Limiter.concurrent): "
                          f"the others wait for a place (the worker logs 'over limit ... rescheduled')")
        doomed = ScheduledHello.perform_in(60, "nobody")
        self.stdout.write(f"enqueued a ScheduledHello in 60 s, then cancelled it: {cancel(doomed)}")
        prefix = runtime.get_config().key_prefix
        AsyncSleepJob.perform_bulk([[0.5, f"{prefix}async-demo"]] * 20)
        self.stdout.write("enqueued 20 AsyncSleepJobs (async def perform, await 0.5 s): they run at once on the "
                          "worker's event loop (their done lines name the thread cogworker-loop)")
        # (One dedup_key for the five: equal pushes are otherwise those of the same arguments.)
        outcomes = [DebouncedJob.set(dedup_key="demo").push(f"{prefix}debounce-demo", n) for n in range(1, 6)]
        said = ", ".join(o.status for o in outcomes)
        self.stdout.write(f"pushed a DebouncedJob five times with one dedup_key (debounce = 1 s): {said}; it runs "
                          "once, with the last push's arguments (5)")
        # (Groups take turns: the small customer's 3 jobs don't wait for the big one's 40.)
        TurnJob.perform_bulk([["big", n, f"{prefix}fair-demo", 0.05] for n in range(40)])
        TurnJob.perform_bulk([["small", n, f"{prefix}fair-demo", 0.05] for n in range(3)])
        RankJob.set(priority=10).perform_async(f"{prefix}fair-demo", "urgent")
        self.stdout.write("enqueued 40 TurnJobs of group 'big', then 3 of group 'small' (group = \"arg:0\"): the "
                          "groups take turns, so small's run among the first jobs; then a RankJob with priority "
                          "10, which runs before the jobs waiting")
