"""How the user endpoints page their lists: `limit` and `offset`."""

from rest_framework import pagination


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """DRF's, with a ceiling on `limit`. Without one, any number goes into SQL's LIMIT: past
    2**63 - 1 the database refuses it (a 500), and below that it asks for the whole table."""

    max_limit = 1000
