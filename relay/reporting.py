import re
from typing import Any

from django.http import HttpRequest
from django.views.debug import SafeExceptionReporterFilter

from relay.tokens import LEAK_RE

# Tokens of ours, and Slack's (a slack connection's token, typed into a form or a request).
SECRET_RE = re.compile(rf"{LEAK_RE.pattern}|xox[a-z](?:\.xox[a-z])?-[0-9A-Za-z-]+")


class RelayExceptionReporterFilter(SafeExceptionReporterFilter):
    """Keeps tokens, Authorization headers and connection strings off error pages and out of
    error reports, even with DEBUG on."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|PEPPER|DATABASE_URL|BROKER_URL|REDIS_URL", flags=re.I
    )

    def get_safe_request_meta(self, request: HttpRequest) -> dict[str, Any]:
        meta = super().get_safe_request_meta(request)
        for key in ("HTTP_AUTHORIZATION", "HTTP_PROXY_AUTHORIZATION", "HTTP_COOKIE"):
            if key in meta:
                meta[key] = self.cleansed_substitute
        return meta

    def get_post_parameters(self, request: HttpRequest | None) -> Any:
        params = super().get_post_parameters(request)
        if not params:
            return params
        cleansed = params.copy()
        for key, values in params.lists():
            cleansed.setlist(key, [SECRET_RE.sub(self.cleansed_substitute, value) for value in values])
        return cleansed

    def get_traceback_frame_variables(self, request: HttpRequest, tb_frame: Any) -> Any:
        cleansed = []
        for name, value in super().get_traceback_frame_variables(request, tb_frame):
            text = value if isinstance(value, str) else repr(value)
            if SECRET_RE.search(text) or "HTTP_AUTHORIZATION" in text:
                value = SECRET_RE.sub(self.cleansed_substitute, text)
                value = re.sub(r"('HTTP_AUTHORIZATION': )'[^']*'", rf"\1'{self.cleansed_substitute}'", value)
            cleansed.append((name, value))
        return cleansed
