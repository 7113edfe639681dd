from django.core.management.base import BaseCommand

from testproject.demo.jobs import FlakyJob, ScheduledHello, SendReceipt


class Command(BaseCommand):
    help = "Enqueue the demo jobs: a SendReceipt, a FlakyJob (succeeds on retry), a ScheduledHello in 5 s."

    def handle(self, *args, **options):
        jids = {
            "SendReceipt": SendReceipt.perform_async(1),
            "FlakyJob": FlakyJob.perform_async(),
            "ScheduledHello (in 5 s)": ScheduledHello.perform_in(5, "cogworker"),
        }
        for name, jid in jids.items():
            self.stdout.write(f"enqueued {name}: {jid}")
