import os

from django.core.files import File
from django.core.files.storage import FileSystemStorage


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
