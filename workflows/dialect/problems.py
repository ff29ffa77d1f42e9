"""One error found in a workflow document, where it is, and what to do about it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    pointer: str  # JSON Pointer into the document, "#/steps/0/image"
    detail: str
    line: int | None = None  # 1-based, of the YAML node the pointer names (or its nearest parent)
    column: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"pointer": self.pointer, "line": self.line, "column": self.column, "detail": self.detail}


class DocumentError(Exception):
    """The document is not a valid workflow; `problems` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(f"{p.pointer}: {p.detail}" for p in problems))
        self.problems = problems


def pointer_part(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def child_pointer(pointer: str, key: object) -> str:
    return f"{pointer}/{pointer_part(key)}"
