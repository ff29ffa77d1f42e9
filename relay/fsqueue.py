"""The filesystem queue `make run` uses when no Redis answers: kombu's filesystem transport
with its races closed.

kombu's own (5.7) lets a reader see a message before it is written: `_put` creates the file
under its final name and only then locks and writes it, so a worker listing the folder in
between takes an empty message, and its JSONDecodeError stops the whole worker ("Unrecoverable
error"). Its exchange table is created the same way (open with truncation, then lock), so a
publisher reading it meanwhile fails to publish. And a taken message is moved to the system
temporary folder, a copy rather than a rename when that is another file system, which two
workers can both make.

Here a message is written under a name no reader looks at and renamed into place (atomic on
one file system), a reader claims a message by renaming it inside the queue folder (one
rename wins), the exchange table is read and changed only under its lock, and a message that
cannot be read (left half-written by a crash before this module) is set aside and logged, not
fatal: every task can be derived again from the database (the sweepers), so nothing is lost.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

SUFFIX = ".msg"
# Names readers skip: a message being written, one being read, one that could not be read.
WRITING, CLAIMED, UNREADABLE = ".writing", ".claimed", ".unreadable"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}{SUFFIX}"
        final = os.path.join(self.data_folder_out, name)
        partial = final + WRITING
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.rename(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to the queue folder") from exc

    def _get(self, queue: str) -> Any:
        wanted = f"{queue}{SUFFIX}"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            path = os.path.join(self.data_folder_in, name)
            claimed = f"{path}{CLAIMED}-{os.getpid()}"
            try:
                os.rename(path, claimed)  # only one reader's rename finds it
            except FileNotFoundError:
                continue
            try:
                with open(claimed, "rb") as f:
                    payload = f.read()
                message = loads(bytes_to_str(payload))
            except (OSError, ValueError):
                log.error("set aside an unreadable message %s", name, exc_info=True)
                os.replace(claimed, path + UNREADABLE)
                continue
            os.remove(claimed)
            return message
        raise Empty()

    def _exchange_table(self, exchange: str, change: Any = None) -> list:
        """The exchange's table, read under a shared lock, or read and rewritten under an
        exclusive one by `change(queues) -> queues`. Never truncated before it is locked."""
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        with os.fdopen(fd, "r+b", buffering=0) as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX if change else fcntl.LOCK_SH)
            try:
                text = bytes_to_str(f.read())
                queues = [filesystem.exchange_queue_t(*q) for q in loads(text)] if text else []
                if change:
                    queues = change(queues)
                    f.seek(0)
                    f.write(str_to_bytes(dumps(queues)))
                    f.truncate()
                return queues
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def get_table(self, exchange: str) -> list:
        return self._exchange_table(exchange)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._exchange_table(exchange, lambda queues: queues if entry in queues else [entry, *queues])

    def _delete(
        self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any
    ) -> None:
        super(filesystem.Channel, self)._delete(queue, exchange, routing_key, pattern, *args, **kwargs)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._exchange_table(exchange, lambda queues: [q for q in queues if q != entry])


class Transport(filesystem.Transport):
    Channel = Channel
