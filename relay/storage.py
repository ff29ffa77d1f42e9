import os

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, storages


class DurableFileSystemStorage(FileSystemStorage):
    """FileSystemStorage that fsyncs each file it saves, and its folder, before returning, so
    "saved" survives a crash or power loss. Events are answered 202 only after this."""

    def _save(self, name: str, content: File) -> str:
        name = super()._save(name, content)
        path = self.path(name)
        with open(path, "rb") as saved:
            os.fsync(saved.fileno())
        folder = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        return name


def save_once(name: str, data: bytes) -> None:
    """Save `data` in the events storage under `name` unless an object is there already:
    names are content addresses (SHA-256 of the data), so what is there is the same bytes.
    (Two racing saves of the same bytes both succeed; the loser's copy gets a suffixed name
    that nothing points at.)"""
    storage = storages["events"]
    if not storage.exists(name):
        storage.save(name, ContentFile(data))
