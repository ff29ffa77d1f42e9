# Loaded with Django so that @shared_task binds to this project's Celery app.
from relay.celery import app as celery_app

__all__ = ["celery_app"]
