from django.db import models


class Receipt(models.Model):
    """Written by the SendReceipt demo job, so the demo shows a job touching the database."""

    order_id = models.IntegerField()
    sent_at = models.DateTimeField()

    def __str__(self):
        return f"receipt for order {self.order_id} at {self.sent_at:%Y-%m-%d %H:%M:%S}"
