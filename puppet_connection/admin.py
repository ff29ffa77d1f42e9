from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.debug import sensitive_variables

from puppet_connection.models import PuppetConnection
from relay import tokens, vault


@admin.register(PuppetConnection)
class PuppetConnectionAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "token_prefix", "created", "last_used", "token_regenerated_at"]
    list_filter = ["created", "last_used"]
    search_fields = ["name", "description", "owner__username", "token_lookup"]
    readonly_fields = ["id", "token_prefix", "created", "last_used", "token_regenerated_at"]
    autocomplete_fields = ["owner"]
    change_form_template = "admin/puppet_connection/puppetconnection/change_form.html"

    def get_fields(self, request: HttpRequest, obj: PuppetConnection | None = None) -> list[str]:
        if obj is None:
            return ["name", "description", "owner"]
        return ["name", "description", "owner", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: PuppetConnection | None = None) -> list[str]:
        # The owner is chosen once; moving a connection would hand its token to another user.
        return [*self.readonly_fields, "owner"] if obj else []

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str]:
        return {"owner": str(request.user.pk), **super().get_changeform_initial_data(request)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[PuppetConnection]:
        return super().get_queryset(request).select_related("owner")

    @sensitive_variables("token")
    def save_model(self, request: HttpRequest, obj: PuppetConnection, form: object, change: bool) -> None:
        if change:
            obj.save()
            return
        # Inside the admin's own transaction: a VaultUnavailable from here rolls the row back.
        token = obj.issue_token()
        request._relay_new_token = token  # type: ignore[attr-defined]  # read by response_add

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except vault.VaultUnavailable as exc:
            self.message_user(request, f"Nothing was saved. {exc}", messages.ERROR)
            # Back to the form with what was typed (the add form takes initial data from GET).
            keep = {key: request.POST.get(key, "") for key in ("name", "description", "owner")}
            return HttpResponseRedirect(f"{request.path}?{urlencode(keep)}")

    def response_add(
        self, request: HttpRequest, obj: PuppetConnection, post_url_continue: str | None = None
    ) -> HttpResponse:
        token = getattr(request, "_relay_new_token", None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        return self._reveal(request, obj, token, created=True)

    def get_urls(self) -> list:
        regenerate = self.admin_site.admin_view(self.regenerate_view)
        return [
            path(
                "<uuid:object_id>/regenerate/",
                regenerate,
                name="puppet_connection_puppetconnection_regenerate",
            ),
            *super().get_urls(),
        ]

    @sensitive_variables("token")
    def regenerate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        connection = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not self.has_change_permission(request, connection):
            return HttpResponse(status=403)
        if request.method != "POST":
            context = {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "original": connection,
                "title": f"Regenerate the token of {connection}?",
            }
            return TemplateResponse(
                request, "admin/puppet_connection/puppetconnection/regenerate_confirm.html", context
            )
        change_url = reverse("admin:puppet_connection_puppetconnection_change", args=[connection.pk])
        try:
            token = connection.regenerate_token()
        except vault.VaultUnavailable as exc:
            self.message_user(request, f"The token was not changed. {exc}", messages.ERROR)
            return HttpResponseRedirect(change_url)
        self.log_change(request, connection, "Regenerated the token.")
        return self._reveal(request, connection, token, created=False)

    def _reveal(
        self, request: HttpRequest, connection: PuppetConnection, token: tokens.PlainToken, created: bool
    ) -> HttpResponse:
        """The one page that ever shows the token. It answers a POST, so there is no URL to
        come back to; no-store keeps it out of the browser's cache and history snapshots."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": connection,
            "token": token,
            "created": created,
            "title": "Copy the connection token now",
            "change_url": reverse("admin:puppet_connection_puppetconnection_change", args=[connection.pk]),
        }
        response = TemplateResponse(
            request, "admin/puppet_connection/puppetconnection/reveal_token.html", context
        )
        response["Cache-Control"] = "no-store"
        return response
