from django.core.management.base import BaseCommand

from django_cogworker import Batch, cancel, chain
from django_cogworker.push import runtime
from testproject.demo.flow_jobs import PartnerCallJob
from testproject.demo.jobs import FlakyJob, ReceiptsSent, ScheduledHello, SendReceipt, Tally


class Command(BaseCommand):
    help = ("Enqueue the demo jobs: a SendReceipt, a FlakyJob (succeeds on retry), a ScheduledHello in 5 s, "
            "a batch of three SendReceipts with a success callback, a chain of two steps, six PartnerCallJobs "
            "limited to three at once, and a ScheduledHello cancelled before it runs.")

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
