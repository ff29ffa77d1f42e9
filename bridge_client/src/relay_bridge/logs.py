"""One line per event, logfmt style, with the run id on every line that concerns a run:
`time=... level=info run=... msg="accepted" lease=...`. Easy to grep, easy to ship."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from typing import Any

logger = logging.getLogger("relay_bridge")


def _value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t\\'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "pid": record.process,
        }
        run_id = getattr(record, "run_id", None)
        if run_id:
            fields["run"] = run_id
        fields["msg"] = record.getMessage()
        fields.update(getattr(record, "fields", {}))
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info)
        return " ".join(f"{key}={_value(value)}" for key, value in fields.items() if value is not None)


class RunLog:
    """The log of one run: every line carries its id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def _log(self, level: int, msg: str, fields: dict[str, Any], exc_info: bool = False) -> None:
        logger.log(level, msg, extra={"run_id": self.run_id, "fields": fields}, exc_info=exc_info)

    def info(self, msg: str, **fields: Any) -> None:
        self._log(logging.INFO, msg, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._log(logging.WARNING, msg, fields)

    def error(self, msg: str, exc_info: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, msg, fields, exc_info)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter())
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
