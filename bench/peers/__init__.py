"""The peers' job modules, each doing exactly the bench's job (see benchproject/jobs.py), plus the
bare redis-py worker loop (floor). Every module reads the Redis URL from BENCH_REDIS_URL."""
