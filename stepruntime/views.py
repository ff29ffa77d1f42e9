"""The step runtime API: relay-core's metadata API (pkg/metadataapi/server/api), at the URL
root, for the step whose credential the request carries (stepruntime.authentication).

Bodies and status codes are relay-core's; its errors (422 for a body or expression it cannot
use, 404, 401) are RFC 9457 problem documents here, with relay-core's error names as codes.
"""

import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpResponse
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from relay.api.exceptions import PayloadTooLarge, TooManyRequests
from relay.api.parsers import RefusedJSON, check_storable, read_bounded, read_json
from relay.api.views import NO_STORE
from stepruntime import services
from stepruntime.authentication import StepCredentialAuthentication
from stepruntime.models import EmittedEvent, StepCredential, StepLog, StepLogMessage
from workflows import engine
from workflows.dialect.errors import EvaluationError
from workflows.dialect.problems import DocumentError
from workflows.models import OverBudget, StepRun, Workflow

MAX_NAME_LENGTH = 255


class Unprocessable(exceptions.APIException):
    """relay-core's 422s: a body, media type or expression it cannot use."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "The request body you provided could not be deserialized."
    default_code = "malformed_request_error"


class RawBodyParser(BaseParser):
    """The body as bytes, whatever its media type (each route decides what it accepts, as
    relay-core does), refused over API_MAX_BODY_BYTES with 413."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> bytes:
        return read_bounded(stream, parser_context, settings.API_MAX_BODY_BYTES)


class IsRunningStep(BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.auth, StepCredential)


class StepView(APIView):
    # Not in the service's OpenAPI schema (/api/schema/): relay-core's API, for steps only,
    # documented in docs/step-runtime-api.md.
    schema = None
    authentication_classes = [StepCredentialAuthentication]
    permission_classes = [IsRunningStep]
    parser_classes = [RawBodyParser]

    @property
    def credential(self) -> StepCredential:
        return self.request.auth  # type: ignore[return-value]

    @property
    def step(self) -> StepRun:
        return self.credential.step_run

    def body(self) -> bytes:
        data = self.request.data
        return data if isinstance(data, bytes) else b""

    def media_type(self) -> str:
        return self.request.content_type.split(";", 1)[0].strip().lower()

    def json_body(self) -> Any:
        try:
            return read_json(self.body())
        except RefusedJSON as exc:
            raise Unprocessable(f"The request body you provided could not be deserialized: {exc}") from None

    def text_body(self, what: str) -> str:
        try:
            text = self.body().decode("utf-8")
            check_storable(text)
        except UnicodeDecodeError:
            raise Unprocessable(f"The {what} is not UTF-8 text.") from None
        except RefusedJSON as exc:
            raise Unprocessable(f"The {what} cannot be stored: {exc.detail}") from None
        return text

    def ended(self) -> exceptions.AuthenticationFailed:
        """The step ended while this request was on its way."""
        return exceptions.AuthenticationFailed("The step's credential has expired: the step has ended.")


def _name(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME_LENGTH or any(ord(c) < 32 or c in '"\\' for c in value):
        raise Unprocessable(
            f"The {what} must be 1 to {MAX_NAME_LENGTH} characters, with no control character, "
            "double quote or backslash.",
            code="malformed_request_error",
        )
    return value


def _over_budget(exc: OverBudget, code: str = "step_budget_exceeded") -> exceptions.APIException:
    """413 for a budget of bytes, 429 for one of counts (docs/security.md "Budgets")."""
    if exc.size:
        return PayloadTooLarge(str(exc), code=code)
    return TooManyRequests(str(exc), code=code)


def _evaluation_error(exc: Exception) -> Unprocessable:
    return Unprocessable(
        f"We could not evaluate this resource expression: {exc}", code="expression_evaluation_error"
    )


# Spec, environment, secrets ------------------------------------------------------------------


class SpecView(StepView):
    def get(self, request: Request) -> Response:
        q, lang = request.query_params.get("q", ""), request.query_params.get("lang", "")
        try:
            result = services.spec(self.step, q, lang)
        except services.UnsupportedLanguage:
            raise Unprocessable(
                f"We don't know the query language {lang!r}.", code="expression_unsupported_language_error"
            ) from None
        except EvaluationError as exc:
            raise _evaluation_error(exc) from None
        return Response(services.envelope(result), headers=NO_STORE)


class EnvironmentView(StepView):
    def get(self, request: Request) -> Response:
        try:
            result = services.environment(self.step)
        except EvaluationError as exc:
            raise _evaluation_error(exc) from None
        return Response(services.envelope(result), headers=NO_STORE)


class EnvironmentVariableView(StepView):
    def get(self, request: Request, name: str) -> Response:
        try:
            result = services.environment_variable(self.step, name)
        except EvaluationError as exc:
            raise _evaluation_error(exc) from None
        if result is None:
            raise exceptions.NotFound("The step's env has no such variable.", code="model_not_found_error")
        return Response(services.envelope(result), headers=NO_STORE)


class SecretView(StepView):
    def get(self, request: Request, name: str) -> Response:
        try:
            value = services.secret(self.step, name)
        except EvaluationError as exc:
            raise _evaluation_error(exc) from None
        if value is None:
            # The same answer whether the workflow has no such secret or the step's spec
            # does not refer to it: a step learns nothing of secrets it was not given.
            raise exceptions.NotFound(
                "The step's spec refers to no such secret of its workflow.", code="model_not_found_error"
            )
        return Response({"key": name, "value": services.jsonable(value)}, headers=NO_STORE)


# Outputs -------------------------------------------------------------------------------------


class OutputView(StepView):
    """PUT /outputs/{name}: set one of the step's own outputs."""

    def put(self, request: Request, name: str) -> Response:
        _name(name, "output's name")
        media_type = self.media_type()
        if media_type == "application/json":
            value = self.json_body()
        elif media_type in ("text/plain", "application/octet-stream", ""):
            value = self.text_body("output")
        else:
            raise Unprocessable(
                f"We don't know how to decode a request body with media type {media_type}.",
                code="api_unknown_request_media_type_error",
            )
        try:
            stored = self.step.put_output(name, value)
        except OverBudget as exc:
            raise _over_budget(exc) from None
        if not stored:
            raise self.ended()
        return Response(status=status.HTTP_201_CREATED)


class StepOutputView(StepView):
    """GET /outputs/{step}/{name}: an output of a step of the same run. PUT
    /outputs/{name}/metadata: mark one of the step's own outputs sensitive (or not)."""

    def get(self, request: Request, step: str, name: str) -> Response:
        source = (
            StepRun.objects.filter(run_id=self.step.run_id, name=step)
            .only("outputs", "output_metadata", "name")
            .first()
        )
        if source is None or name not in (source.outputs or {}):
            raise exceptions.NotFound("No such output in this run.", code="model_not_found_error")
        # The value itself, sensitive or not: a step of the run reads it (and its log masks it).
        return Response(
            {
                "task_name": source.name,
                "key": name,
                "value": source.outputs[name],
                "metadata": {"sensitive": source.output_is_sensitive(name)},
            },
            headers=NO_STORE,
        )

    def put(self, request: Request, step: str, name: str) -> Response:
        if name != "metadata":
            raise exceptions.MethodNotAllowed("PUT")
        output = _name(step, "output's name")
        body = self.json_body()
        if not isinstance(body, dict) or not isinstance(body.get("sensitive", False), bool):
            raise Unprocessable('The body is `{"sensitive": true|false}`.')
        try:
            kept = self.step.put_output_metadata(output, {"sensitive": body.get("sensitive", False)})
        except OverBudget as exc:
            raise _over_budget(exc) from None
        if not kept:
            raise self.ended()
        return Response(status=status.HTTP_201_CREATED)


# Status, decorators, events, logs ------------------------------------------------------------


def _timestamp(value: Any) -> bool:
    return value is None or isinstance(value, str)


class StatusView(StepView):
    """PUT /status: what relay-core's entrypoint reports (the process's exit code, the when
    condition's outcome). Kept for people; the engine decides the step's status itself."""

    def put(self, request: Request) -> Response:
        body = self.json_body()
        if not isinstance(body, dict) or set(body) - {"process_state", "when_condition"}:
            raise Unprocessable('The body is `{"process_state": {…}, "when_condition": {…}}`.')
        process, when = body.get("process_state"), body.get("when_condition")
        if process is not None and not (
            isinstance(process, dict)
            and isinstance(process.get("exit_code", 0), int)
            and not isinstance(process.get("exit_code", 0), bool)
            and _timestamp(process.get("timestamp"))
        ):
            raise Unprocessable("process_state is `{exit_code: <integer>, timestamp: <time>}`.")
        if when is not None and not (
            isinstance(when, dict)
            and isinstance(when.get("when_condition_status", ""), str)
            and _timestamp(when.get("timestamp"))
        ):
            raise Unprocessable("when_condition is `{when_condition_status: <string>, timestamp: <time>}`.")
        self.credential.report_status(body)
        return Response(status=status.HTTP_201_CREATED)


class DecoratorView(StepView):
    """POST /decorators/{name}: a UI decorator (`{"type": "link", "description", "uri"}`),
    shown with the step in the workflow-runs API."""

    def post(self, request: Request, name: str) -> Response:
        _name(name, "decorator's name")
        body = self.json_body()
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            raise Unprocessable('A decorator is a JSON object with a string "type".')
        try:
            stored = self.step.put_decorator(name, body)
        except OverBudget as exc:
            raise _over_budget(exc) from None
        if not stored:
            raise self.ended()
        return Response(status=status.HTTP_201_CREATED)


class EventView(StepView):
    """POST /events: `{"data": {…}, "key": "…"}` (relay_sdk's `events.emit`)."""

    def post(self, request: Request) -> Response:
        body = self.json_body()
        if not isinstance(body, dict) or not isinstance(body.get("data", {}), dict):
            raise Unprocessable('An event is `{"data": {…}, "key": "…"}`.')
        key = body.get("key", "")
        if not isinstance(key, str) or len(key) > 255:
            raise Unprocessable("An event's key is a string of at most 255 characters.")
        data = body.get("data") or {}
        try:
            with transaction.atomic():
                self.credential.spend_event(len(self.body()))
                EmittedEvent.objects.create(step_run=self.step, key=key, data=data)
        except OverBudget as exc:
            raise _over_budget(exc) from None
        return Response(status=status.HTTP_202_ACCEPTED)


def _octet_stream(view: StepView) -> bytes:
    if view.media_type() != "application/octet-stream":
        raise Unprocessable(
            f"We don't know how to decode a request body with media type {view.media_type() or '(none)'}.",
            code="api_unknown_request_media_type_error",
        )
    body = view.body()
    if len(body) > StepLog.MAX_RECORD_BYTES:
        raise PayloadTooLarge(f"A log record is at most {StepLog.MAX_RECORD_BYTES} bytes.")
    return body


class LogView(StepView):
    """POST /logs: open a log (relay-core: a protobuf LogCreateRequest, kept as sent). The
    answer's body is the new log's id (relay-core: a protobuf LogCreateResponse)."""

    def post(self, request: Request) -> HttpResponse:
        header = _octet_stream(self)
        try:
            with transaction.atomic():
                self.credential.spend_log(len(header))
                log = StepLog.objects.create(step_run=self.step, header=header)
        except OverBudget as exc:
            raise _over_budget(exc) from None
        return HttpResponse(str(log.id).encode(), status=201, content_type="application/octet-stream")


class LogMessageView(StepView):
    def post(self, request: Request, log_id: str) -> HttpResponse:
        body = _octet_stream(self)
        log = StepLog.objects.filter(pk=_uuid_or_none(log_id), step_run=self.step).first()
        if log is None:
            raise exceptions.NotFound("The step has no such log.", code="model_not_found_error")
        try:
            with transaction.atomic():
                self.credential.spend_log(len(body))
                StepLogMessage.objects.create(log=log, body=body)
        except OverBudget as exc:
            raise _over_budget(exc) from None
        return HttpResponse(b"", status=202, content_type="application/octet-stream")


def _uuid_or_none(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


# Conditions, validation, workflow runs -------------------------------------------------------


class ConditionsView(StepView):
    """GET /conditions: the step's `when`, `{"resolved", "success", "message"}`."""

    def get(self, request: Request) -> Response:
        try:
            return Response(services.conditions(self.step))
        except services.ConditionTypeError as exc:
            raise Unprocessable(str(exc), code="condition_type_error") from None
        except EvaluationError as exc:
            raise _evaluation_error(exc) from None


class ValidateView(StepView):
    """POST /validate: the spec must evaluate (422 when it cannot). relay-core then checks it
    against its image's schema when its registry has one; there is no registry here."""

    def post(self, request: Request) -> HttpResponse:
        try:
            services.spec(self.step)
        except EvaluationError as exc:
            raise _evaluation_error(exc) from None
        return HttpResponse(b"null", content_type="application/json")


class WorkflowRunView(StepView):
    """POST /workflows/{name}/run: `{"parameters": {"p": {"value": …}}}` starts a run of the
    workflow owner's workflow `name` (relay_sdk's `workflows.run`); 429 past RUN_MAX_DEPTH
    or RUN_MAX_IN_PROGRESS."""

    def post(self, request: Request, name: str) -> Response:
        body = self.json_body()
        parameters = body.get("parameters", {}) if isinstance(body, dict) else None
        if not isinstance(parameters, dict) or not all(
            isinstance(v, dict) and set(v) <= {"value"} for v in parameters.values()
        ):
            raise Unprocessable('The body is `{"parameters": {"<name>": {"value": …}}}`.')
        values = {k: v.get("value") for k, v in parameters.items()}
        try:
            run, number = services.start_workflow(self.step, name, values)
        except Workflow.DoesNotExist:
            raise exceptions.NotFound(
                "The workflow's owner has no workflow by that name.", code="model_not_found_error"
            ) from None
        except (engine.ParameterError, DocumentError) as exc:
            raise Unprocessable(str(exc), code="model_write_error") from None
        except OverBudget as exc:
            raise _over_budget(exc, "run_budget_exceeded") from None
        app_url = f"{settings.RELAY_PUBLIC_URL}/api/workflow-runs/{run.pk}/"
        return Response(
            {"workflow_run": {"name": name, "run_number": number, "app_url": app_url}},
            status=status.HTTP_201_CREATED,
        )
