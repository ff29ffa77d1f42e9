"""gunicorn's settings, for `make run`, the benchmarks and production alike:
`gunicorn -c python:relay.gunicorn_conf relay.asgi:application`.

gunicorn manages the processes; each runs uvicorn's event loop (relay.server.RelayWorker)
serving the ASGI application. A bridge's long-poll (`GET /_puppet/runs?wait=N`, up to a
minute) then costs a socket and a coroutine, not a thread, and heartbeats are served on the
loop without one (runs/api/fast.py). Everything else is Django's synchronous code, each
request in a thread of its own while it runs (asgiref's ThreadSensitiveContext), so the
admin and the APIs run side by side as they did under threaded workers.
"""

import os

from relay.server import KEEPALIVE

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
worker_class = "relay.server.RelayWorker"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
keepalive = KEEPALIVE
graceful_timeout = 10
accesslog = os.environ.get("ACCESS_LOG", "-") or None
control_socket_disable = True
backlog = 4096  # a burst of reconnecting bridges waits in the queue, not refused
