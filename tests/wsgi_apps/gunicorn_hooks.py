"""gunicorn.conf.py for the tests: the hooks of cronoq.contrib.gunicorn."""

from cronoq.contrib.gunicorn import post_worker_init, when_ready, worker_exit  # noqa: F401
