"""How the user endpoints page their lists: `limit` and `offset`."""

from rest_framework import pagination
from rest_framework.request import Request

from relay.api.params import query_int


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """DRF's, except that a `limit` or `offset` that is not a whole number in ASCII digits is
    a 400 (DRF's takes `٣` as 3 and quietly ignores `abc`), and with a ceiling on `limit`.
    Without one, any number goes into SQL's LIMIT: past 2**63 - 1 the database refuses it (a
    500), and below that it asks for the whole table."""

    max_limit = 1000

    def get_limit(self, request: Request) -> int | None:
        limit = query_int(request, self.limit_query_param, 0, lowest=1) or self.default_limit
        return min(limit, self.max_limit) if self.max_limit and limit else limit

    def get_offset(self, request: Request) -> int:
        return query_int(request, self.offset_query_param, 0)
