from django.db.models import Model, QuerySet
from django.views.decorators.debug import sensitive_variables
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

# The token is in the body: no cache on the way may keep a copy.
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class OwnedViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Rows with an owner and a UUID (connections, triggers). Subclasses set queryset and
    serializer_class. Alone, it lets users see and manage their own rows and no one else's;
    each subclass gives its model's rule (its get_queryset and permission_classes: see
    relay.api.permissions)."""

    lookup_value_converter = "uuid"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    permission_classes = [IsAuthenticated]

    def get_queryset(self) -> QuerySet[Model]:
        rows = self.queryset.model._default_manager.select_related("owner")
        return rows.filter(owner=self.request.user.pk)


class TokenHolderViewSet(OwnedViewSet):
    """Token holders: create answers the new token once; `regenerate` replaces it.
    Subclasses also set token_serializer_class (the serializer with a TokenField)."""

    token_serializer_class: type

    @sensitive_variables("serializer")
    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        holder = serializer.save()
        body = self.token_serializer_class(holder, context=serializer.context).data
        return Response(body, status=status.HTTP_201_CREATED, headers=NO_STORE)

    @action(detail=True, methods=["post"])
    @sensitive_variables("token")
    def regenerate(self, request: Request, pk: str | None = None) -> Response:
        holder = self.get_object()
        token = holder.regenerate_token()
        body = self.token_serializer_class(holder, context={"request": request, "token": token}).data
        return Response(body, headers=NO_STORE)
