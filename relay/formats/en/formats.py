"""How the admin and the pages write times: to the second, in the current time zone (UTC,
TIME_ZONE), saying which: "2026-11-26 05:18:28 UTC". English's own formats stop at the
minute and write "5:18 a.m.", which a sentence ending in a full stop doubles ("a.m..").
FORMAT_MODULE_PATH points here; input formats stay Django's."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
