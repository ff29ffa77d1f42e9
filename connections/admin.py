from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables

from connections.api.serializers import SLACK_TOKEN_HELP, slack_token
from connections.models import SlackConnection
from relay.admin import OwnedAdmin


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
class SlackConnectionAdmin(OwnedAdmin):
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
