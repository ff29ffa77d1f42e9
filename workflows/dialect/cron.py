"""Schedule triggers' `schedule`: the cron dialect Relay documents (github.com/robfig/cron's
standard parser), read here with cronsim, and the next time it is due, in UTC.

What is accepted, as robfig/cron's ParseStandard accepts it:
- five fields (minute, hour, day of month, month, day of week) with `*`, `,`, `-`, `/`,
  names of months and days in any case, and `?` for `*` in the day fields;
- the descriptors `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`),
  `@hourly`, and `@every <duration>` (Go's syntax: `90s`, `5m`, `1h30m`; at least a minute
  here, since schedules are checked every few seconds, not every one);
- a `CRON_TZ=<zone>` (or `TZ=<zone>`) prefix; without it the schedule is UTC.
cronsim also reads `L`, `W` and `#` (Quartz's extensions); robfig/cron does not, but there
is no harm in them. A schedule with seconds (six fields) is refused, as robfig/cron does.
"""

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MIN_EVERY = timedelta(minutes=1)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|ms|us|µs|ns)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class InvalidSchedule(ValueError):
    """The message says what is wrong, for the document's author."""


@dataclass(frozen=True)
class Schedule:
    expression: str  # five fields, or "" for an interval
    zone: str  # an IANA zone name; "UTC" without a prefix
    every: timedelta | None = None

    def next_after(self, moment: datetime) -> datetime:
        """The first time strictly after `moment` that the schedule is due, in UTC. For
        `@every`, that is `moment` plus the interval (the interval counts from the last run)."""
        if self.every is not None:
            return (moment + self.every).astimezone(UTC)
        zone = ZoneInfo(self.zone)
        # cronsim yields times after its start, to the minute; it walks the zone's own
        # clock, so a daily 02:30 in a zone that skips 02:00-03:00 runs at 03:00 that day.
        start = moment.astimezone(zone).replace(second=0, microsecond=0)
        for due in CronSim(self.expression, start):
            if due > moment:
                return due.astimezone(UTC)
        raise InvalidSchedule("The schedule is never due.")  # cronsim gave up after 50 years


def parse(text: str) -> Schedule:
    """The schedule, or InvalidSchedule saying why not."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchedule("The schedule is empty; write a cron expression such as '*/5 * * * *'.")
    text = text.strip()
    zone = "UTC"
    if text.startswith(("CRON_TZ=", "TZ=")):
        prefix, _, text = text.partition(" ")
        zone = prefix.partition("=")[2]
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(f"Unknown time zone {zone!r} in {prefix!r}.") from None
        text = text.strip()
    if text.startswith("@every"):
        return Schedule("", zone, _interval(text.removeprefix("@every").strip()))
    if text.startswith("@"):
        if text.lower() not in DESCRIPTORS:
            raise InvalidSchedule(
                f"Unknown descriptor {text!r}; use one of {', '.join(DESCRIPTORS)} or @every."
            )
        text = DESCRIPTORS[text.lower()]
    fields = text.split()
    if len(fields) != 5:
        raise InvalidSchedule(
            f"A cron schedule has 5 fields (minute hour day-of-month month day-of-week), not {len(fields)}."
        )
    fields = [field.upper() for field in fields]
    fields[2], fields[4] = (_question(fields[2]), _question(fields[4]))
    expression = " ".join(fields)
    schedule = Schedule(expression, zone)
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise InvalidSchedule(f"Not a valid cron schedule: {exc}.") from None
    schedule.next_after(datetime.now(UTC))  # one that is never due is refused too
    return schedule


def _question(field: str) -> str:
    # robfig/cron: "?" stands for "*" in the day fields.
    return "*" if field == "?" else field


def _interval(text: str) -> timedelta:
    if not text or _DURATION_PART.sub("", text):
        raise InvalidSchedule(f"@every takes a duration such as 90s, 5m or 1h30m, not {text!r}.")
    seconds = sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(text))
    every = timedelta(seconds=seconds)
    if every < MIN_EVERY:
        raise InvalidSchedule(f"@every is at least {MIN_EVERY.total_seconds():g} seconds here.")
    return every
