"""Encrypted job arguments (docs/encryption.md): ``encrypt = True`` on a Job class, in ``set()``,
or ``@task(encrypt=True)``.

    keys.py     ENCRYPTION_KEYS checked (errors name the entry's position, never the key), the
                KeyRing (first key seals, every key opens), ``new_key`` (``manage.py cogworker genkey``)
    codec.py    seal a payload's arguments (AES-256-GCM, the key's id in the blob), open them
    errors.py   NoEncryptionKeys (a push refused), KeyUnavailable and SealBroken (dead at once),
                UnsealedArguments (a SealBroken: clear arguments written beside a seal)
    checks.py   cogworker.E020: a job class that encrypts, and no keys to do it with

Where it plugs in: ``push/job.py`` seals when a payload is built (``JobSetter.build``; the
unique digest keyed); ``codec.perform_arguments`` opens, called by the innermost step of a worker's
server chain (``engine/process/launcher.py``'s ``run_job``) and of the testing modes: the payload stays
sealed, only the arguments ``perform`` is called with are clear. Needs the ``cryptography``
package: ``pip install 'django-cogworker[encryption]'``.
"""
