"""gunicorn's settings, for `make run`, the benchmarks and production alike:
`gunicorn -c python:relay.gunicorn_conf relay.wsgi`.

Threaded workers, because a bridge's long-poll (`GET /_puppet/runs?wait=N`) holds its request
for up to a minute: with sync workers a few waiting bridges would take every worker."""

import os

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "16"))
keepalive = 30  # bridges and steps keep their connections between calls
graceful_timeout = 10
accesslog = os.environ.get("ACCESS_LOG", "-") or None
control_socket_disable = True
