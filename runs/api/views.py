from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from relay.api.authentication import ConnectionTokenAuthentication
from relay.api.permissions import IsConnection


class RunListView(APIView):
    """`GET /_puppet/runs`: the connection's runs that are not complete.

    Until runs exist this answers an empty list, which is how a bridge (or a user with curl)
    proves its connection token works."""

    authentication_classes = [ConnectionTokenAuthentication]
    permission_classes = [IsConnection]

    @extend_schema(responses=inline_serializer("RunList", {"runs": serializers.ListField()}))
    def get(self, request: Request) -> Response:
        return Response({"runs": []})
