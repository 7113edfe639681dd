"""Signature: one job with its arguments, ``MyJob.s(1, 2)``: a step of a workflow (workflows.py:
chain, group, chord), pushed when its turn comes. ``Job.s`` makes one through the batches'
declaration (features/declared.py provides it as ``"signature"``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BatchError
from ...push.arguments import check_call, check_json_native
from ...push.job import Job, JobSetter


class Signature:
    """One job with its arguments: ``MyJob.s(1, 2)``."""

    def __init__(self, job_class: type[Job], args: Sequence[Any], kwargs: dict[str, Any],
                 options: dict[str, Any] | None = None, takes_previous: bool = False):
        if not (isinstance(job_class, type) and issubclass(job_class, Job)) or job_class is Job:
            raise BatchError(f"a workflow step must be a Job class (a subclass of Job), got {job_class!r}")
        self.job_class = job_class
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.options = dict(options or {})
        self.takes_previous = takes_previous
        check_json_native(self.args, "args")
        check_json_native(self.kwargs, "kwargs")
        JobSetter(job_class, self.options)  # (checks the options)

    def check(self) -> Signature:
        """Raise TypeError if ``perform`` can't take these arguments (and the previous value, when
        asked for): called by the workflow taking this step, as ``with_previous`` may come after."""
        check_call(self.job_class, [None, *self.args] if self.takes_previous else self.args, self.kwargs,
                   f"{self.job_class.name}.s(...): ")
        return self

    def set(self, **options: Any) -> Signature:
        """The same step with push options (queue, retry, ...)."""
        return Signature(self.job_class, self.args, self.kwargs, {**self.options, **options}, self.takes_previous)

    def with_previous(self) -> Signature:
        """The same step, given the previous step's return value as its first argument."""
        return Signature(self.job_class, self.args, self.kwargs, self.options, True)

    def describe(self) -> str:
        return str(self.job_class.name).rsplit(".", 1)[-1]

    def launch(self, previous: Any, keep: bool) -> str | None:
        setter = JobSetter(self.job_class, self.options)
        return setter._client().push(self._build(setter, previous, keep))

    @staticmethod
    def launch_many(signatures: Sequence[Signature], previous: Any, keep: bool) -> list[str | None]:
        """Push these steps as ``launch`` would each, in one ``push_bulk`` (one round trip, and the
        batch counts them in one step: a group of 10,000 pushed one at a time took two round trips
        a job); return their jids, in order (None for one a middleware stopped)."""
        if not signatures:
            return []
        built = []
        for signature in signatures:
            setter = JobSetter(signature.job_class, signature.options)
            built.append(signature._build(setter, previous, keep))
        pushed = set(setter._client().push_bulk(built))
        return [payload["jid"] if payload["jid"] in pushed else None for payload in built]

    def _build(self, setter: JobSetter, previous: Any, keep: bool) -> dict[str, Any]:
        payload = setter.build([previous, *self.args] if self.takes_previous else self.args, self.kwargs)
        if keep:
            payload["keep_result"] = True
        return payload

    def dump(self) -> dict[str, Any]:
        """The step as stored in its workflow's batch data, clear (the batches feature seals the
        arguments of a job that encrypts: workflows.dump_step)."""
        return {"t": "sig", "c": self.job_class.name, "a": self.args, "k": self.kwargs, "o": self.options,
                "p": self.takes_previous}

    @classmethod
    def load(cls, job_class: type[Job], data: dict[str, Any]) -> Signature:
        """The step ``dump`` stored, its arguments clear."""
        return cls(job_class, data["a"], data["k"], data["o"], data["p"])
