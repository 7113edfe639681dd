"""Progress for every job (docs/jobs.md): ``self.progress(done, total=None, note="")``.

    tracker      one run's latest report, written to ``progress:<jid>`` at most once a second
"""
