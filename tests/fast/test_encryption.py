"""Encrypted arguments, without a worker: the codec, the keys' checks, pushes that seal and refuse.

What users rely on: sealed arguments round-trip to the job exactly; a key rotation still opens
what the old key sealed; a missing key, a changed blob or another class's blob never opens (and
says which); a bad ENCRYPTION_KEYS entry is named by position, the key itself never shown; a job
that encrypts is never pushed in clear text, even with no keys configured; arguments written
beside a seal (in Redis, after it) are refused, never run.
"""

from __future__ import annotations

import base64
import json
import os
import re

import pytest
from django.core.management import call_command
from django.test import override_settings
from helpers import every_value

from django_cogworker import testing
from django_cogworker.conf import build_config
from django_cogworker.engine.settle.retry import RetryPolicy
from django_cogworker.errors import ConfigError, NotRetried
from django_cogworker.features.encryption import checks as encryption_checks
from django_cogworker.features.encryption import codec
from django_cogworker.features.encryption.errors import KeyUnavailable, NoEncryptionKeys, SealBroken, UnsealedArguments
from django_cogworker.features.encryption.keys import KeyRing, key_id, new_key, problems
from django_cogworker.push import runtime
from testproject.demo.secret_jobs import SecretJob

SECRET = "Zanzibar-4111-1111-1111-1111"
OLD, NEW = new_key(), new_key()


def test_sealed_arguments_open_to_the_same_values():
    ring = KeyRing([NEW])
    args, kwargs = ["a", 1, 2.5, None, [True, {"x": SECRET}]], {"k": "é\n", "n": 2**70}
    blob = codec.seal(args, kwargs, "app.Job", ring)
    assert SECRET not in blob and "Zanzibar" not in blob
    assert blob.startswith(f"v1.{key_id(base64.urlsafe_b64decode(NEW))}.")
    assert codec.unseal(blob, "app.Job", ring) == (args, kwargs)


def test_each_seal_of_the_same_arguments_differs():
    # (a fresh nonce each time: two pushes of one secret can't be told equal from Redis)
    ring = KeyRing([NEW])
    assert codec.seal([SECRET], {}, "app.Job", ring) != codec.seal([SECRET], {}, "app.Job", ring)


def test_after_a_rotation_the_old_key_still_opens_and_the_new_one_seals():
    old_blob = codec.seal([SECRET], {}, "app.Job", KeyRing([OLD]))
    rotated = KeyRing([NEW, OLD])
    assert codec.unseal(old_blob, "app.Job", rotated) == ([SECRET], {})
    new_blob = codec.seal([SECRET], {}, "app.Job", rotated)
    assert new_blob.split(".")[1] == key_id(base64.urlsafe_b64decode(NEW))
    with pytest.raises(KeyUnavailable):
        codec.unseal(new_blob, "app.Job", KeyRing([OLD]))


def test_a_key_the_ring_lacks_is_named_by_its_id_never_by_its_value():
    blob = codec.seal([SECRET], {}, "app.Job", KeyRing([OLD]))
    with pytest.raises(KeyUnavailable) as caught:
        codec.unseal(blob, "app.Job", KeyRing([NEW]))
    assert key_id(base64.urlsafe_b64decode(OLD)) in str(caught.value)
    assert OLD not in str(caught.value) and NEW not in str(caught.value)
    assert isinstance(caught.value, NotRetried)


@pytest.mark.parametrize("tamper", ["flip", "truncate", "other_class", "garbage", "version"])
def test_a_changed_blob_does_not_open(tamper):
    ring = KeyRing([NEW])
    blob = codec.seal([SECRET], {}, "app.Job", ring)
    job_class = "app.Job"
    if tamper == "flip":
        head, data = blob.rsplit(".", 1)
        middle = len(data) // 2
        blob = f"{head}.{data[:middle]}{'A' if data[middle] != 'A' else 'B'}{data[middle + 1:]}"
    elif tamper == "truncate":
        blob = blob[:-4]
    elif tamper == "other_class":
        job_class = "app.Other"  # (the blob is bound to its class: copied into another's payload, it won't open)
    elif tamper == "garbage":
        blob = "not a blob"
    else:
        blob = "v9" + blob[2:]
    with pytest.raises(SealBroken):
        codec.unseal(blob, job_class, ring)


def status(event: str = "success", **changed) -> dict:
    """A batch status as the batch's script writes it into a callback's payload when ``event`` fires."""
    return {"bid": "b1", "event": event, "total": 2, "pending": 0, "failures": 0, "dead": 0, "created_at": 1.7e9,
            "description": "", **changed}


def test_a_payload_sealed_keeps_its_own_fields_clear_and_its_callback_status_head():
    ring = KeyRing([NEW])
    payload = {"jid": "j1", "class": "app.Job", "args": ["STATUS", SECRET], "kwargs": {"who": SECRET},
               "queue": "q", "retry": 3}
    codec.seal_payload(payload, ring, head=[(codec.BATCH_STATUS, "success")])
    assert payload["args"] == ["STATUS"] and payload["kwargs"] == {}
    assert {k: payload[k] for k in ("jid", "class", "queue", "retry")} == {"jid": "j1", "class": "app.Job",
                                                                             "queue": "q", "retry": 3}
    assert SECRET not in json.dumps(payload)
    payload["args"][0] = status()  # (what the batch's script puts in place of the placeholder)
    assert codec.open_arguments(payload, ring) == ([status(), SECRET], {"who": SECRET})
    with pytest.raises(KeyUnavailable):
        codec.open_arguments(payload, None)  # (a worker with no keys at all)


def sealed(head=(), **clear) -> dict:
    """A payload of SecretJob's arguments ("k", SECRET) sealed as a push seals it, then ``clear``
    written beside the seal (what someone who can write to Redis can do)."""
    payload = {"jid": "j1", "class": SecretJob.name, "args": [*(["PLACEHOLDER"] * len(head)), "k", SECRET],
               "kwargs": {}, "queue": "default"}
    codec.seal_payload(payload, KeyRing([NEW]), head=head)
    payload.update(clear)
    return payload


CALLBACK = [(codec.BATCH_STATUS, "success")]


@pytest.mark.parametrize("payload, said", [
    (sealed(kwargs={"mode": "raise_with_arg"}), "clear kwargs beside its sealed arguments ('mode')"),
    (sealed(kwargs={"fails": -1}, args=[]), "clear kwargs beside its sealed arguments ('fails')"),
    (sealed(args=["elsewhere"]), "1 clear argument(s) beside its sealed ones, where its seal allows none"),
    (sealed(args=[status()]), "1 clear argument(s) beside its sealed ones, where its seal allows none"),
    (sealed(CALLBACK, args=[status(), "more"]), "2 clear argument(s) beside its sealed ones, where its seal "
                                                "allows a batch status (success)"),
    (sealed(CALLBACK, args=[status()], kwargs={"secret": "mine"}), "clear kwargs beside its sealed arguments"),
    (sealed(CALLBACK, args=[status("death")]), "not of event 'success', the event this callback was set for"),
    (sealed(CALLBACK, args=[status(mode="raise_with_arg")]), "field(s) no batch writes: 'mode'"),
    (sealed(CALLBACK, args=[status(total="many")]), "has total of a type or value no batch writes"),
    (sealed(CALLBACK, args=["elsewhere"]), "a batch status, is a str"),
    (sealed(CALLBACK, args=["PLACEHOLDER"]), "a batch status, is a str"),  # (fired by no batch)
], ids=["kwargs", "kwargs-and-empty-args", "an-arg", "a-status-where-none-is-sealed", "an-arg-after-the-status",
        "kwargs-beside-a-status", "another-event", "a-field-added-to-the-status", "a-count-not-a-number",
        "not-a-status", "the-placeholder"])
def test_arguments_written_beside_a_seal_are_refused_never_merged_in(payload, said):
    # (They were merged in unchecked: kwargs written next to a blob ran the job with them, and an
    # error message quoting one carried the secret into the dead set.)
    with pytest.raises(UnsealedArguments) as caught:
        codec.open_arguments(payload, KeyRing([NEW]))
    message = str(caught.value)
    assert said in message and "refused, never run" in message
    assert SECRET not in message and "raise_with_arg" not in message and "elsewhere" not in message
    assert isinstance(caught.value, SealBroken) and isinstance(caught.value, NotRetried)  # (dead at once)
    filing = RetryPolicy(build_config({})).filing({**payload, "retry": 25, "dead": False}, caught.value)
    assert filing is not None and filing.target == "dead" and filing.payload["dead_reason"] == message


def test_what_the_package_itself_puts_beside_a_seal_still_opens():
    assert codec.open_arguments(sealed(), KeyRing([NEW])) == (["k", SECRET], {})
    for absent in ("args", "kwargs"):  # (a payload written without them: nothing beside the seal)
        payload = sealed()
        del payload[absent]
        assert codec.open_arguments(payload, KeyRing([NEW])) == (["k", SECRET], {})
    for event in ("complete", "success", "death"):
        payload = sealed([(codec.BATCH_STATUS, event)])
        # (created_at left out, as the script does for a batch without it)
        payload["args"] = [{k: v for k, v in status(event).items() if k != "created_at"}]
        assert codec.open_arguments(payload, KeyRing([NEW]))[0] == [payload["args"][0], "k", SECRET]


def test_a_seal_with_a_head_relabelled_as_one_without_does_not_open():
    # (v2 names its clear head; relabelled v1, which has none, it would drop that check: its version is
    # authenticated with it.)
    payload = sealed(CALLBACK, args=[status()])
    assert payload["encrypted"].startswith("v2.")
    payload["encrypted"] = "v1" + payload["encrypted"][2:]
    with pytest.raises(SealBroken, match="don't open"):
        codec.open_arguments(payload, KeyRing([NEW]))
    plain = sealed()
    plain["encrypted"] = "v2" + plain["encrypted"][2:]
    with pytest.raises(SealBroken, match="don't open"):
        codec.open_arguments(plain, KeyRing([NEW]))


def test_key_problems_name_each_entry_by_position_and_never_show_the_key():
    short = base64.urlsafe_b64encode(os.urandom(16)).decode()
    found = problems([NEW, short, "not base64 at all!", 42, NEW])
    assert found == [
        'COGWORKER["ENCRYPTION_KEYS"][1] must be 32 random bytes in URL-safe base64 (as `manage.py cogworker '
        'genkey` prints), got 16 bytes',
        'COGWORKER["ENCRYPTION_KEYS"][2] must be 32 random bytes in URL-safe base64 (as `manage.py cogworker '
        "genkey` prints), got 18 characters that aren't URL-safe base64",
        'COGWORKER["ENCRYPTION_KEYS"][3] must be 32 random bytes in URL-safe base64 (as `manage.py cogworker '
        "genkey` prints), got a int",
        'COGWORKER["ENCRYPTION_KEYS"][4] is the same key as COGWORKER["ENCRYPTION_KEYS"][0]',
    ]
    assert not any(NEW in p or short in p for p in found)


def test_a_lone_key_given_without_its_list_is_refused_without_being_shown():
    with pytest.raises(ConfigError) as caught:
        build_config({"ENCRYPTION_KEYS": NEW})
    assert caught.value.errors == ['COGWORKER["ENCRYPTION_KEYS"] must be a list of keys (the first seals, all '
                                   'open), got a str']


def test_the_config_never_shows_its_keys():
    config = build_config({"ENCRYPTION_KEYS": [NEW, OLD]})
    assert config.encryption_keys == (NEW, OLD)
    assert NEW not in repr(config) and OLD not in repr(config) and "encryption_keys=<2 keys>" in repr(config)
    assert NEW not in repr(KeyRing([NEW]))


def test_genkey_prints_a_key_the_setting_takes(capsys):
    call_command("cogworker", "genkey")
    key = capsys.readouterr().out.strip()
    assert problems([key]) == [] and len(base64.urlsafe_b64decode(key)) == 32


def test_a_push_of_a_job_that_encrypts_leaves_no_clear_argument_in_its_payload():
    with testing.fake() as jobs:
        SecretJob.perform_async("k", SECRET)
        SecretJob.perform_bulk([["k", SECRET + "-1"], ["k", SECRET + "-2"]])
        SecretJob.set(queue="mail").perform_in(60, "k", SECRET, fails=1)
        pushed = jobs.jobs(SecretJob)
        assert all("Zanzibar" not in json.dumps(p) and p["args"] == [] and "encrypted" in p for p in pushed)
        assert jobs.args(SecretJob) == [["k", SECRET], ["k", SECRET + "-1"], ["k", SECRET + "-2"], ["k", SECRET]]


def test_set_encrypt_seals_a_job_class_that_does_not_and_can_turn_it_off():
    from testproject.demo.jobs import RecordJob

    with testing.fake() as jobs:
        RecordJob.set(encrypt=True).perform_async("k", SECRET)
        SecretJob.set(encrypt=False).perform_async("k", "plain")
        assert "encrypted" in jobs.jobs(RecordJob)[0] and "Zanzibar" not in json.dumps(jobs.jobs(RecordJob))
        assert jobs.jobs(SecretJob)[0]["args"] == ["k", "plain"]


def test_with_no_keys_a_job_that_encrypts_is_refused_at_push_not_pushed_in_clear():
    with override_settings(COGWORKER={"ENCRYPTION_KEYS": []}), testing.fake() as jobs:
        with pytest.raises(NoEncryptionKeys, match=r'SecretJob encrypts its arguments .* is empty: nothing was pushed'):
            SecretJob.perform_async("k", SECRET)
        assert len(jobs) == 0
    runtime.reset()


def test_the_system_check_names_each_class_that_encrypts_when_there_are_no_keys():
    registry = {"app.Secret": SecretJob, "app.Plain": object}
    assert encryption_checks.problems(registry, ()) == [
        'app.Secret encrypts its arguments (encrypt=True) but COGWORKER["ENCRYPTION_KEYS"] is empty: each push of '
        'it would fail. Set COGWORKER["ENCRYPTION_KEYS"] to a list of keys (`manage.py cogworker genkey` prints one)']
    assert encryption_checks.problems(registry, (NEW,)) == []


def test_manage_py_check_reports_it_as_an_error(capsys):
    from django.core.management.base import SystemCheckError

    with override_settings(COGWORKER={"ENCRYPTION_KEYS": []}), pytest.raises(SystemCheckError, match="cogworker.E020"):
        call_command("check")
    runtime.reset()


def test_a_key_no_worker_has_files_the_job_in_dead_at_once_even_with_retries_left():
    payload = {"jid": "j", "class": "app.Job", "args": [], "kwargs": {}, "retry": 25, "dead": False}
    filing = RetryPolicy(build_config({})).filing(payload, KeyUnavailable("its arguments were encrypted with key "
                                                                          "'abcd1234', which is not among ..."))
    assert filing is not None and filing.target == "dead"
    assert filing.payload["dead_reason"].startswith("its arguments were encrypted with key 'abcd1234'")


@pytest.mark.django_db
def test_the_admin_and_the_cli_show_encrypted_for_the_arguments_never_the_clear_text(rb, client):
    import io
    import time
    from html import unescape
    from urllib.parse import quote

    from django.contrib.auth.models import User

    from django_cogworker import api
    from django_cogworker.push import payload as payloads
    from django_cogworker.push.job import JobSetter

    SecretJob.set(on_commit=False).perform_in(600, "k", SECRET)  # (the test runs in a transaction)
    dead = JobSetter(SecretJob, {}).build(["k", SECRET], {})
    dead.update(error_class="RuntimeError", error_message="failing on purpose", failed_at=time.time(),
                dead_reason="retries exhausted")
    rb.zadd("cogworker:dead", {payloads.encode(dead): time.time()})
    client.force_login(User.objects.create_superuser("root", password="pw"))
    base = "/admin/django_cogworker/"
    token = api.DeadSet().page(1, 25).items[0].token
    pages = [client.get(f"{base}{page}/").content.decode()
             for page in ("scheduled", "dead", f"dead/job/{quote(token)}")]
    for page in pages:
        shown = unescape(page)
        assert "(encrypted)" in shown, re.findall(r"cw-args.{0,300}", page)
        assert "Zanzibar" not in page and '"(encrypted)"' not in shown  # (shown as such, not as a JSON string)
    out = io.StringIO()
    call_command("cogworker", "dead", stdout=out)
    assert "(encrypted)" in out.getvalue() and "Zanzibar" not in out.getvalue()
    out = io.StringIO()
    call_command("cogworker", "scheduled", "--json", stdout=out)
    assert [item["args"] for item in json.loads(out.getvalue())["items"]] == ["(encrypted)"]


def test_a_unique_job_that_encrypts_is_still_unique_and_its_lock_is_no_plain_hash_of_its_arguments(r):
    from django_cogworker.push.unique import digest

    unique = SecretJob.set(unique_for=60, on_commit=False)
    first = unique.perform_async("k", SECRET)
    assert first is not None and unique.perform_async("k", SECRET) is None  # (the duplicate)
    assert unique.perform_async("k", SECRET + "-other") is not None
    locks = r.keys("cogworker:unique:*")
    plain = digest({"class": SecretJob.name, "args": ["k", SECRET], "kwargs": {}, "queue": "default"})
    assert len(locks) == 2 and f"cogworker:unique:{plain}" not in locks  # (keyed: a guess can't be tested against it)


def test_a_batch_callback_that_encrypts_shows_its_options_as_encrypted(rb):
    from django_cogworker import Batch, api
    from testproject.demo.secret_jobs import SecretCallback

    batch = Batch().on("success", SecretCallback, key="cb", secret=SECRET)
    with batch.jobs():
        SecretJob.set(on_commit=False).perform_async("k", SECRET)
    detail = api.BatchSet().get(batch.bid)
    assert detail is not None and [c.options for c in detail.callbacks] == ["(encrypted)"]
    assert not [key for key, value in every_value(rb) if b"Zanzibar" in key + value]


@pytest.mark.parametrize("change", [{"p": True}, {"o": {"encrypt": False}}, {"o": {"queue": "elsewhere"}}],
                         ids=["with-previous-turned-on", "encryption-turned-off", "another-queue"])
def test_a_sealed_workflow_step_opens_only_with_the_options_it_was_stored_with(change):
    # (Stored clear beside its seal in its chain's batch data: "p" turned on put the previous step's
    # value, which Redis holds clear, before its sealed arguments; "encrypt": false pushed them clear.)
    from django_cogworker.features.batches.workflows import dump_part, load

    step = SecretJob.s("k", SECRET).set(queue="mail")
    stored = json.loads(json.dumps(dump_part(step)))  # (as the chain's batch data holds it)
    assert SECRET not in json.dumps(stored) and stored["p"] is False
    loaded = load(stored)
    assert (loaded.args, loaded.options, loaded.takes_previous) == (["k", SECRET], {"queue": "mail"}, False)
    with pytest.raises(SealBroken, match="don't open"):
        load({**stored, **change})
    taking = json.loads(json.dumps(dump_part(step.with_previous())))
    assert load(taking).takes_previous is True
    with pytest.raises(SealBroken, match="don't open"):
        load({**taking, "p": False})


def test_a_ring_of_one_key_is_counted_as_one():
    # ("COGWORKER["ENCRYPTION_KEYS"] (1 keys)" in the error of a job sealed with a key the worker lacks.)
    blob = codec.seal([SECRET], {}, "app.Job", KeyRing([OLD]))
    with pytest.raises(KeyUnavailable, match=r'COGWORKER\["ENCRYPTION_KEYS"\] \(1 key\); add that key'):
        codec.unseal(blob, "app.Job", KeyRing([NEW]))
    assert repr(KeyRing([NEW])) == "KeyRing(1 key)" and repr(KeyRing([NEW, OLD])) == "KeyRing(2 keys)"
    assert "encryption_keys=<1 key>" in repr(build_config({"ENCRYPTION_KEYS": [NEW]}))
