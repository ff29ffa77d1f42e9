"""Every connection type's admin shares ConnectionAdmin: who sees and does what is
connections.permissions, as in the API. Staff see and manage their own connections here
whatever their permissions; other users' are seen and deleted with the model's permissions,
and changed (renamed, their tokens set or regenerated) by superusers only."""

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables

from connections.api.serializers import SLACK_TOKEN_HELP, slack_token
from connections.models import Connection, SlackConnection
from connections.permissions import Action, connections_for, may
from relay.admin import OwnedAdmin


class ConnectionAdmin(OwnedAdmin):
    """Each row says what may be done to it (connections.permissions). A change page of
    another user's connection is read-only to staff; its regenerate page (TokenHolderAdmin)
    is refused them, as is its delete without the delete permission, in the list's action
    too (the admin asks has_delete_permission of each row it would delete)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Connection]:
        return connections_for(request.user, super().get_queryset(request))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: Connection | None = None) -> bool:
        return obj is None or may(request.user, Action.VIEW, obj)

    def has_change_permission(self, request: HttpRequest, obj: Connection | None = None) -> bool:
        return obj is None or may(request.user, Action.CHANGE, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Connection | None = None) -> bool:
        return obj is None or may(request.user, Action.DELETE, obj)

    def get_deleted_objects(self, objs: QuerySet | list[Connection], request: HttpRequest) -> tuple:
        """As the API's delete: what goes with a connection (a Puppet connection's runs) goes
        for whoever may delete the connection, not by those models' own permissions; each
        connection is asked of `may` (the list's action gets a queryset of many)."""
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        refused = [c for c in objs if not self.has_delete_permission(request, c)]
        return deleted, counts, {self.opts.verbose_name} if refused else set(), protected


class SlackConnectionForm(forms.ModelForm):
    # Never rendered with a value: the token is write-only here as in the API.
    token = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        max_length=510,
        validators=[slack_token],
        help_text=SLACK_TOKEN_HELP,
    )

    class Meta:
        model = SlackConnection
        fields = ["name", "description", "owner"]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding:
            # Changing a connection keeps its token unless a new one is given.
            token = self.fields["token"]  # this form's own copy
            token.required = False
            token.label = "Replace the token"
            token.help_text = f"Leave empty to keep the current token. {SLACK_TOKEN_HELP}"


@admin.register(SlackConnection)
class SlackConnectionAdmin(ConnectionAdmin):
    form = SlackConnectionForm
    list_display = ["name", "owner", "created", "token_replaced_at"]
    list_filter = ["created"]
    readonly_fields = ["id", "created", "token_replaced_at"]
    editable_fields = ("name", "description", "owner", "token")

    @method_decorator(sensitive_post_parameters("token"))
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        return super().changeform_view(request, object_id, form_url, extra_context)

    @sensitive_variables("token")
    def save_model(self, request: HttpRequest, obj: SlackConnection, form: forms.Form, change: bool) -> None:
        # Inside the admin's own transaction: a VaultUnavailable from here rolls the row back.
        token = form.cleaned_data.get("token")
        if token:
            obj.save_with_token(token)
        else:
            obj.save()
