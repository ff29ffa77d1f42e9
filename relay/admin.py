"""What the admins of owned rows share (a Vault failure is a message, never a half-saved
row) and of tokens (the token is shown once, on the page that answers the create or the
regenerate). And the admin of user API tokens."""

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import JSONField, Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.debug import sensitive_variables

from relay import tokens, vault
from relay.api.parsers import RefusedJSON, read_json
from relay.models import UserToken


class StrictJSONFormField(forms.JSONField):
    """A JSON field of an admin form, read by the API's strict reader: a NUL, a lone
    surrogate, `1e400`, NaN or nesting past 64 is a form error, not a database error (a 500)."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or not isinstance(value, str) or value in self.empty_values:
            return super().to_python(value)
        try:
            converted = read_json(value.encode("utf-8", "surrogatepass"))
        except RefusedJSON as exc:
            raise ValidationError(str(exc), code="invalid") from None
        return forms.fields.JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        # The form shown again with its error shows the text as typed (Django's own would
        # parse it again, unbounded, and render a lone surrogate it cannot encode).
        if self.disabled or not isinstance(data, str):
            return super().bound_data(data, initial)
        try:
            return read_json(data.encode("utf-8", "surrogatepass"))
        except RefusedJSON:
            return forms.fields.InvalidJSONInput(data)


class RevealTokenOnceAdmin(admin.ModelAdmin):
    """An admin whose add page answers with the new token, shown that once (_reveal)."""

    token_hint = ""  # where the user puts the token, shown beside it

    def response_add(
        self, request: HttpRequest, obj: tokens.DigestToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        token = getattr(request, "_relay_new_token", None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        return self._reveal(request, obj, token, created=True)

    def _url(self, action: str, *args: object) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{action}", args=args)

    def _context(self, request: HttpRequest, holder: tokens.DigestToken, **extra: object) -> dict:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": holder,
            "changelist_url": f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
            "change_url": self._url("change", holder.pk),
            **extra,
        }

    def _reveal(
        self, request: HttpRequest, holder: tokens.DigestToken, token: tokens.PlainToken, created: bool
    ) -> HttpResponse:
        """The one page that ever shows the token. It answers a POST, so there is no URL to
        come back to; no-store keeps it out of the browser's cache."""
        context = self._context(
            request,
            holder,
            token=token,
            created=created,
            token_hint=self.token_hint,
            title="Copy the token now",
        )
        response = TemplateResponse(request, "admin/relay/reveal_token.html", context)
        response["Cache-Control"] = "no-store"
        return response


class OwnedAdmin(admin.ModelAdmin):
    """Rows a user owns, with a Vault secret (connections, triggers): the owner is chosen
    once, and a Vault failure is a message and the form again, never a half-saved row."""

    search_fields = ["name", "description", "owner__username"]
    autocomplete_fields = ["owner"]
    formfield_overrides = {JSONField: {"form_class": StrictJSONFormField}}
    # What the add form asks for; the change form shows these and readonly_fields.
    editable_fields: tuple[str, ...] = ("name", "description", "owner")
    # Fields of the add form kept when Vault fails and the form is shown again.
    add_form_fields: tuple[str, ...] = ("name", "description", "owner")

    def get_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        if obj is None:
            return list(self.editable_fields)
        return [*self.editable_fields, *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        # The owner is chosen once: moving a row would hand its secret to another user.
        return [*self.readonly_fields, "owner"] if obj else []

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("owner")

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str]:
        return {"owner": str(request.user.pk), **super().get_changeform_initial_data(request)}

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        return list(self.autocomplete_fields) if request.user.is_superuser else []

    def formfield_for_foreignkey(self, db_field: object, request: HttpRequest, **kwargs: object) -> object:
        # A new row is its maker's, unless a superuser says otherwise: its token (or secret)
        # would otherwise be another user's, used by their workflows, chosen by this one.
        if getattr(db_field, "name", "") == "owner" and not request.user.is_superuser:
            kwargs["queryset"] = get_user_model()._default_manager.filter(pk=request.user.pk)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        # The admin saves inside a transaction: a VaultUnavailable from save_model rolls the
        # row back.
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except vault.VaultUnavailable as exc:
            self.message_user(request, f"Nothing was saved. {exc}", messages.ERROR)
            # Back to the form with what was typed (the add form takes initial data from GET).
            keep = {key: request.POST.get(key, "") for key in self.add_form_fields}
            return HttpResponseRedirect(f"{request.path}?{urlencode(keep)}")


class TokenHolderAdmin(RevealTokenOnceAdmin, OwnedAdmin):
    change_form_template = "admin/relay/token_change_form.html"
    search_fields = [*OwnedAdmin.search_fields, "token_lookup"]

    @sensitive_variables("token")
    def save_model(self, request: HttpRequest, obj: tokens.TokenHolder, form: object, change: bool) -> None:
        if change:
            obj.save()
            return
        # Inside the admin's own transaction: a VaultUnavailable from here rolls the row back.
        request._relay_new_token = obj.issue_token(self.secret_from_form(form))  # type: ignore[attr-defined]

    def secret_from_form(self, form: object) -> dict[str, str]:
        """Other values of the holder's Vault secret that the add form collects."""
        return {}

    def get_urls(self) -> list:
        name = f"{self.opts.app_label}_{self.opts.model_name}_regenerate"
        return [
            path("<uuid:object_id>/regenerate/", self.admin_site.admin_view(self.regenerate_view), name=name),
            *super().get_urls(),
        ]

    @sensitive_variables("token")
    def regenerate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        holder = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not self.has_change_permission(request, holder):
            return HttpResponse(status=403)
        if request.method != "POST":
            title = f"Regenerate the token of {holder}?"
            context = self._context(request, holder, title=title)
            return TemplateResponse(request, "admin/relay/regenerate_confirm.html", context)
        try:
            token = holder.regenerate_token()
        except vault.VaultUnavailable as exc:
            self.message_user(request, f"The token was not changed. {exc}", messages.ERROR)
            return HttpResponseRedirect(self._url("change", holder.pk))
        self.log_change(request, holder, "Regenerated the token.")
        return self._reveal(request, holder, token, created=False)


@admin.register(UserToken)
class UserTokenAdmin(RevealTokenOnceAdmin):
    """User API tokens: the list shows their lookup part, never a token; adding one shows it
    once; deleting one revokes it. Only a superuser makes one for someone else (a token is
    that user's every right); other staff, with the add permission, for themselves."""

    list_display = ["token_prefix", "owner", "name", "created", "last_used", "legacy"]
    list_filter = ["legacy", "created", "last_used"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username", "token_lookup"]
    readonly_fields = ["token_prefix", "created", "last_used", "legacy"]
    token_hint = "Send it as 'Authorization: Token <token>' (or 'Bearer <token>') to the API."

    def get_fields(self, request: HttpRequest, obj: UserToken | None = None) -> list[str]:
        return ["owner", "name"] if obj is None else ["owner", "name", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: UserToken | None = None) -> list[str]:
        return [*self.readonly_fields, "owner"] if obj else []

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str]:
        return {"owner": str(request.user.pk)}

    def formfield_for_foreignkey(self, db_field: object, request: HttpRequest, **kwargs: object) -> object:
        if getattr(db_field, "name", "") == "owner" and not request.user.is_superuser:
            kwargs["queryset"] = get_user_model()._default_manager.filter(pk=request.user.pk)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    @sensitive_variables("token")
    def save_model(self, request: HttpRequest, obj: UserToken, form: object, change: bool) -> None:
        if change:
            obj.save()
            return
        request._relay_new_token = obj.issue_token()  # type: ignore[attr-defined]

    def delete_model(self, request: HttpRequest, obj: UserToken) -> None:
        obj.revoke()
