"""Signals other apps listen to, so that runs depends on none of them."""

from django.dispatch import Signal

# A run's status changed (sent after the change commits): `run`, the Run.
run_changed = Signal()
