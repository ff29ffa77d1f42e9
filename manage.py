#!/usr/bin/env python
import os
import sys

NOT_CONFIGURED = (
    'manage.py: no settings here: run `make run` once (it generates var/), use `make manage ARGS="…"`,'
    " or set SECRET_KEY and TOKEN_PEPPERS (docs/configuration.md)."
)
NO_VENV = 'manage.py needs the project\'s virtualenv: `make manage ARGS="…"` or `.venv/bin/python manage.py`'

if __name__ == "__main__":
    environ = dict(os.environ)  # before `relay` is imported: its Celery app sets defaults
    try:
        from relay.embedded import checkout_env
    except ImportError:
        sys.exit(NO_VENV)
    # In a checkout, `make run`'s generated var/ (secret key, pepper, embedded OpenBao) is the
    # configuration; a deployment sets its environment and this changes nothing.
    env = checkout_env(environ)
    if env is None:
        sys.exit(NOT_CONFIGURED)
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
