"""A backend's `backend_<backend>_<option>` settings, checked once at start: anything
unknown or malformed is a ConfigError naming the key (the CLI exits 2 with it)."""

from __future__ import annotations

from typing import Any

from relay_bridge.config import ConfigError

TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


class Options:
    def __init__(self, backend: str, defaults: dict[str, Any], given: dict[str, Any]) -> None:
        self.backend = backend
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ConfigError(
                self.key(unknown[0]), f"is not an option of the {backend} backend ({', '.join(defaults)})"
            )
        self.values = {**defaults, **given}
        self.given = given

    def exclusive(self, *names: str) -> None:
        """At most one of `names` may be given (the module's key and ours for one thing)."""
        both = [name for name in names if self.given.get(name) is not None]
        if len(both) > 1:
            raise ConfigError(self.key(both[1]), f"give it or {self.key(both[0])}, not both")

    def key(self, name: str) -> str:
        return f"backend_{self.backend}_{name}"

    def string(self, name: str) -> str | None:
        value = self.values[name]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value):
            raise ConfigError(self.key(name), "must be a string")
        return str(value)

    def integer(self, name: str, minimum: int | None = None) -> int | None:
        value = self.values[name]
        if value is None:
            return None
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ConfigError(self.key(name), "must be a whole number") from None
        if isinstance(value, bool) or (isinstance(value, str) and not value.strip().lstrip("-").isdigit()):
            raise ConfigError(self.key(name), "must be a whole number")
        if minimum is not None and number < minimum:
            raise ConfigError(self.key(name), f"must be {minimum} or more")
        return number

    def boolean(self, name: str) -> bool | None:
        value = self.values[name]
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in TRUE + FALSE:
            return value.lower() in TRUE
        raise ConfigError(self.key(name), "must be true or false")

    def argv(self, name: str) -> list[str] | None:
        """A command as the module gives it, a list (`["bolt"]`, `["ssh", "-F", "cfg"]`), or
        one path as a string; None when not given."""
        value = self.values[name]
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(self.key(name), "must be a command: a list of its words, or a path")
        return list(value)

    def key_values(self, name: str) -> list[str]:
        """A list of `Key=value` strings (or one comma-separated string of them)."""
        value = self.values[name]
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
            raise ConfigError(self.key(name), "must be a list of Key=value options")
        return [v.strip() for v in value]
