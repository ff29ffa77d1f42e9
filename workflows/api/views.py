"""Workflows, their runs, approvals and secrets over the API (user auth).

Who may do what is workflows.permissions, the admin's rule too: a user does anything to their
own workflows and runs (answering an approval needs `workflows.approve_steprun`, the owner
included). What decides the code that runs as the owner (the document, its triggers and
secrets) and starting a run are the owner's and superusers' alone; other staff's permissions
give view, delete, the view of runs, cancel and approvals. Rows a user may not see are 404s;
what they may not do to a row they see is a 403.

A workflow is named in the path; it is the requester's own, or with `?owner=<username>`
(staff with the view permission) another user's. A superuser makes one for another user with
`POST /api/workflows/?owner=<username>`.
"""

from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from connections.models import name_validator
from relay.api.exceptions import Conflict as ConflictError
from relay.api.exceptions import TooManyRequests
from relay.api.params import query_int, query_text
from relay.api.problems import PROBLEM_CONTENT_TYPE, problem
from relay.api.views import NO_STORE
from scriptsteps import services as scripts
from workflows import engine
from workflows.api.parsers import WORKFLOW_DOCUMENT_PARSERS
from workflows.api.serializers import (
    DocumentErrorSerializer,
    RevisionSerializer,
    SecretSerializer,
    WorkflowCreateSerializer,
    WorkflowRunCreateSerializer,
    WorkflowRunSerializer,
    WorkflowRunSummarySerializer,
    WorkflowSerializer,
    WorkflowUpdateSerializer,
)
from workflows.dialect.problems import DocumentError, Problem
from workflows.dialect.validate import validate
from workflows.models import (
    Conflict,
    OverBudget,
    RunStatus,
    StepRun,
    Workflow,
    WorkflowRun,
    WorkflowSecret,
)
from workflows.permissions import Action, is_superuser, may, runs_for, workflows_for

INVALID_WORKFLOW = OpenApiResponse(
    inline_serializer(
        "WorkflowInvalid",
        {
            "type": serializers.CharField(),
            "title": serializers.CharField(),
            "status": serializers.IntegerField(),
            "detail": serializers.CharField(),
            "instance": serializers.CharField(),
            "errors": DocumentErrorSerializer(many=True),
        },
    ),
    description="An RFC 9457 problem (application/problem+json).",
    examples=[
        OpenApiExample(
            "unknown dependency",
            value={
                "type": "urn:relay:problem:invalid_workflow",
                "title": "Bad Request",
                "status": 400,
                "detail": "dependsOn names 'build', which is not a step.",
                "instance": "/api/workflows/validate",
                "errors": [
                    {
                        "pointer": "#/steps/1/dependsOn",
                        "line": 7,
                        "column": 14,
                        "detail": "dependsOn names 'build', which is not a step.",
                    }
                ],
            },
        )
    ],
)
PROBLEM = OpenApiResponse(description="An RFC 9457 problem (application/problem+json).")


def invalid_document(request: Request, problems: list[Problem]) -> Response:
    """400 with the document's errors, each with its JSON Pointer into the document, its
    line and column."""
    errors = [p.as_dict() for p in problems]
    detail = problems[0].detail if len(errors) == 1 else f"The workflow has {len(errors)} errors."
    body = problem(400, detail, "invalid_workflow", request.path, errors=errors)
    return Response(body, status=400, content_type=PROBLEM_CONTENT_TYPE)


class WorkflowValidateView(APIView):
    """`POST /api/workflows/validate`: is this YAML a valid Relay v1 workflow? The errors say
    where (JSON Pointer, line and column) and what to change."""

    parser_classes = WORKFLOW_DOCUMENT_PARSERS

    @extend_schema(
        operation_id="workflows_validate",
        request={"application/yaml": {"type": "string", "description": "The workflow document (YAML)"}},
        responses={
            200: inline_serializer(
                "WorkflowValid",
                {
                    "valid": serializers.BooleanField(),
                    "warnings": DocumentErrorSerializer(many=True, required=False),
                },
            ),
            400: INVALID_WORKFLOW,
        },
    )
    def post(self, request: Request) -> Response:
        result = validate(request.data if isinstance(request.data, str) else "")
        if result.valid:
            body: dict[str, object] = {"valid": True}
            if result.warnings:
                body["warnings"] = [w.as_dict() for w in result.warnings]
            return Response(body)
        return invalid_document(request, result.problems)


OWNER_PARAMETER = OpenApiParameter(
    "owner", str, description="Another user's workflow (staff with the view permission)."
)
NEW_OWNER_PARAMETER = OpenApiParameter(
    "owner", str, description="Whose workflow it is: the requester's, or (superusers only) another user's."
)
# Why the owner's alone: said in each 403.
OWNERS_ALONE = "runs with its owner's connections, so only its owner or a superuser may {what}."


def _require(user: Any, action: Action, workflow: Workflow, what: str) -> None:
    if not may(user, action, workflow):
        if action in (Action.CHANGE, Action.RUN):
            detail = "A workflow " + OWNERS_ALONE.format(what=what)
        else:
            detail = f"You may not {what} another user's workflow."
        raise exceptions.PermissionDenied(detail)


@extend_schema_view(
    list=extend_schema(parameters=[OWNER_PARAMETER]),
    retrieve=extend_schema(parameters=[OWNER_PARAMETER]),
    create=extend_schema(
        request=WorkflowCreateSerializer,
        responses={201: WorkflowSerializer, 400: INVALID_WORKFLOW, 403: PROBLEM},
        parameters=[NEW_OWNER_PARAMETER],
    ),
    update=extend_schema(
        request=WorkflowUpdateSerializer,
        responses={200: WorkflowSerializer, 400: INVALID_WORKFLOW},
        parameters=[OWNER_PARAMETER],
    ),
    destroy=extend_schema(responses={204: None, 409: PROBLEM}, parameters=[OWNER_PARAMETER]),
)
class WorkflowViewSet(viewsets.GenericViewSet):
    """Workflows by name. `PUT` saves a new revision of the document; runs pin the revision
    they started from. The document's push triggers are made and deleted with its revisions:
    the answer that made one has its token, that once, in `triggers`."""

    queryset = Workflow.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = WorkflowSerializer
    lookup_field = "name"
    lookup_url_kwarg = "name"

    def get_queryset(self) -> QuerySet[Workflow]:
        user = self.request.user
        rows = workflows_for(user, Workflow.objects.select_related("owner"))
        owner = query_text(self.request, "owner")
        if owner is not None and owner != user.get_username():
            return rows.filter(owner__username=owner)
        if self.action == "list" and owner is None:
            return rows
        return rows.filter(owner=user)

    def get_object(self) -> Workflow:
        workflow = self.get_queryset().filter(name=self.kwargs["name"]).first()
        if workflow is None:
            raise exceptions.NotFound("No such workflow.")
        return workflow

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(WorkflowSerializer(page, many=True).data)

    def retrieve(self, request: Request, name: str) -> Response:
        return Response(WorkflowSerializer(self.get_object()).data)

    def create(self, request: Request) -> Response:
        owner = self._new_owner(request)
        fields = WorkflowCreateSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        data = fields.validated_data
        taken = (
            "You already have a workflow with this name."
            if owner == request.user
            else f"{owner.get_username()} already has a workflow with this name."
        )
        if Workflow.objects.filter(owner=owner, name=data["name"]).exists():
            raise exceptions.ValidationError({"name": [taken]}, "unique")
        try:
            with transaction.atomic():
                workflow = Workflow.objects.create(
                    owner=owner, name=data["name"], description=data["description"]
                )
                revision = workflow.add_revision(data["source"], request.user)
        except DocumentError as exc:
            return invalid_document(request, exc.problems)
        except IntegrityError:  # a concurrent create of the same name
            raise exceptions.ValidationError({"name": [taken]}, "unique") from None
        body = WorkflowSerializer(workflow, context={"new_triggers": revision.new_triggers}).data
        return Response(body, status=status.HTTP_201_CREATED, headers=NO_STORE)

    def _new_owner(self, request: Request) -> Any:
        """The requester, or the user `?owner=` names when a superuser makes it."""
        username = query_text(request, "owner")
        if username is None or username == request.user.get_username():
            return request.user
        if not is_superuser(request.user):
            raise exceptions.PermissionDenied(
                "A workflow runs with its owner's connections, so only a superuser makes one for "
                "another user."
            )
        owner = get_user_model()._default_manager.filter(username=username, is_active=True).first()
        if owner is None:
            raise exceptions.ValidationError({"owner": ["No active user has this username."]}, "unknown")
        return owner

    def update(self, request: Request, name: str) -> Response:
        workflow = self.get_object()
        _require(request.user, Action.CHANGE, workflow, "change its document")
        fields = WorkflowUpdateSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        try:
            with transaction.atomic():
                revision = workflow.add_revision(fields.validated_data["source"], request.user)
                if "description" in fields.validated_data:
                    workflow.description = fields.validated_data["description"]
                    workflow.save(update_fields=["description", "updated"])
        except DocumentError as exc:
            return invalid_document(request, exc.problems)
        body = WorkflowSerializer(workflow, context={"new_triggers": revision.new_triggers}).data
        return Response(body, headers=NO_STORE)

    def destroy(self, request: Request, name: str) -> Response:
        workflow = self.get_object()
        _require(request.user, Action.DELETE, workflow, "delete")
        with transaction.atomic():
            Workflow.objects.select_for_update().filter(pk=workflow.pk).first()
            if workflow.runs.exclude(status=RunStatus.COMPLETE).exists():
                raise ConflictError("The workflow has runs that are not complete; cancel them first.")
            workflow.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={200: RevisionSerializer(many=True)}, parameters=[OWNER_PARAMETER])
    def revisions(self, request: Request, name: str) -> Response:
        """The document's revisions, newest first."""
        workflow = self.get_object()
        revisions = workflow.revisions.select_related("created_by").order_by("-number")
        page = self.paginate_queryset(revisions)
        return self.get_paginated_response(RevisionSerializer(page, many=True).data)

    @extend_schema(
        request=WorkflowRunCreateSerializer,
        responses={201: WorkflowRunSerializer, 400: PROBLEM, 429: PROBLEM},
        parameters=[OWNER_PARAMETER],
    )
    def runs(self, request: Request, name: str) -> Response:
        """Start a run of the newest revision. A required parameter without a value, or one
        the workflow does not declare, is a 400 pointing at `#/parameters/<name>`; a 429 when
        the workflow's owner has RUN_MAX_IN_PROGRESS runs not complete."""
        workflow = self.get_object()
        _require(request.user, Action.RUN, workflow, "start its runs")
        fields = WorkflowRunCreateSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        try:
            run = engine.create_run(workflow, fields.validated_data["parameters"], created_by=request.user)
        except engine.ParameterError as exc:
            errors = {
                name: [serializers.ErrorDetail("A required parameter has no value.", "required")]
                for name in exc.missing
            }
            errors |= {
                name: [serializers.ErrorDetail("The workflow declares no such parameter.", "unknown")]
                for name in exc.unknown
            }
            errors |= {
                name: [serializers.ErrorDetail(f"The value cannot be a parameter: {why}.", "invalid")]
                for name, why in exc.invalid.items()
            }
            raise exceptions.ValidationError({"parameters": errors}) from None
        except OverBudget as exc:
            raise TooManyRequests(str(exc), code="runs_in_progress_exceeded") from None
        except DocumentError as exc:
            # Saved under older rules (a budget since lowered): a new revision must replace it.
            raise ConflictError(f"The workflow's newest revision is not valid any more: {exc}") from None
        return Response(WorkflowRunSerializer(_run(run.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=SecretSerializer, responses={204: None}, parameters=[OWNER_PARAMETER])
    def put_secret(self, request: Request, name: str, secret: str) -> Response:
        """Set a secret (write-only: its value is kept in Vault and never shown back)."""
        workflow = self._for_secrets(request)
        fields = SecretSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        WorkflowSecret.put(workflow, secret, fields.validated_data["value"], request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={204: None}, parameters=[OWNER_PARAMETER])
    def delete_secret(self, request: Request, name: str, secret: str) -> Response:
        workflow = self._for_secrets(request)
        deleted, _ = WorkflowSecret.objects.filter(workflow=workflow, name=secret).delete()
        if not deleted:
            raise exceptions.NotFound("The workflow has no secret by this name.")
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _for_secrets(self, request: Request) -> Workflow:
        workflow = self.get_object()
        _require(request.user, Action.CHANGE, workflow, "change its secrets")
        try:
            name_validator(self.kwargs["secret"])
        except Exception:
            raise exceptions.ValidationError(
                {
                    "secret": [
                        "Secret names are letters, digits, '.', '_' and '-', starting with a letter or digit."
                    ]
                }
            ) from None
        if len(self.kwargs["secret"]) > 64:
            raise exceptions.ValidationError({"secret": ["Secret names are at most 64 characters."]})
        return workflow


LOG_PAGE = 256 * 1024


class StepLogSerializer(serializers.Serializer):
    step = serializers.CharField()
    status = serializers.CharField()
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField()
    length = serializers.IntegerField(help_text="Characters stored so far.")
    text = serializers.CharField(allow_blank=True)
    complete = serializers.BooleanField(help_text="The step has ended and nothing more will come.")


def _run(run_id: Any) -> WorkflowRun:
    return WorkflowRun.objects.select_related("workflow__owner", "revision", "created_by").get(pk=run_id)


@extend_schema_view(
    list=extend_schema(
        responses=WorkflowRunSummarySerializer(many=True),
        parameters=[
            OpenApiParameter("workflow", str, description="A workflow's name."),
            OpenApiParameter("status", enum=[s.value for s in RunStatus]),
            OpenApiParameter("owner", str, description="The workflow owner's username."),
        ],
    ),
)
class WorkflowRunViewSet(viewsets.GenericViewSet):
    """Runs, newest first: their status and outcome (RFC 0005), parameters and steps. The
    list leaves the steps' outputs and decorators to each run's own page."""

    queryset = WorkflowRun.objects.none()  # the model, for the schema; get_queryset() scopes
    serializer_class = WorkflowRunSerializer
    lookup_value_converter = "uuid"

    def get_queryset(self) -> QuerySet[WorkflowRun]:
        steps = StepRun.objects.select_related("decided_by")
        if self.action == "list":
            # Not even read: a step's outputs may be megabytes (STEP_OUTPUTS_MAX_BYTES).
            steps = steps.defer("outputs", "decorators", "state")
        runs = WorkflowRun.objects.select_related(
            "workflow__owner", "revision", "created_by"
        ).prefetch_related(Prefetch("steps", queryset=steps))
        return runs_for(self.request.user, runs)

    def list(self, request: Request) -> Response:
        runs = self.get_queryset()
        if (name := query_text(request, "workflow")) is not None:
            runs = runs.filter(workflow__name=name)
        if (owner := query_text(request, "owner")) is not None:
            runs = runs.filter(workflow__owner__username=owner)
        if (wanted := query_text(request, "status")) is not None:
            if wanted not in RunStatus.values:
                raise exceptions.ValidationError({"status": [f"One of {', '.join(RunStatus.values)}."]})
            runs = runs.filter(status=wanted)
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(WorkflowRunSummarySerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(WorkflowRunSerializer(self.get_object()).data)

    @extend_schema(request=None, responses={202: WorkflowRunSerializer, 409: PROBLEM})
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel the run: steps not started are skipped, steps in progress cancelled (a
        Puppet run through its own cancel). 409 when the run is complete."""
        run = self.get_object()
        _require(request.user, Action.CANCEL, run.workflow, "cancel runs of")
        try:
            engine.cancel_run(run)
        except Conflict as exc:
            raise ConflictError(str(exc)) from None
        return Response(WorkflowRunSerializer(_run(run.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: WorkflowRunSerializer, 403: PROBLEM, 409: PROBLEM})
    def approve(self, request: Request, pk: str, step: str) -> Response:
        """Approve an approval step waiting for its answer (needs workflows.approve_steprun)."""
        return self._answer(request, step, approve=True)

    @extend_schema(request=None, responses={200: WorkflowRunSerializer, 403: PROBLEM, 409: PROBLEM})
    def reject(self, request: Request, pk: str, step: str) -> Response:
        """Reject an approval step waiting for its answer: the run fails."""
        return self._answer(request, step, approve=False)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "offset", int, description="Where to start, in characters (a tail's next_offset)."
            ),
            OpenApiParameter("limit", int, description=f"At most this many characters (up to {LOG_PAGE})."),
        ],
        responses={200: StepLogSerializer, 400: PROBLEM, 404: PROBLEM},
    )
    def log(self, request: Request, pk: str, step: str) -> Response:
        """A script step's output, as stored while it runs (its secrets masked): read from
        `offset` and ask again from `next_offset` to follow it; `complete` once the step has
        ended and everything was read."""
        run = self.get_object()
        step_run = StepRun.objects.filter(run=run, name=step).first()
        if step_run is None:
            raise exceptions.NotFound("The run has no step by this name.")
        offset = query_int(request, "offset", 0, 0, 2**31 - 1)
        limit = query_int(request, "limit", LOG_PAGE, 1, LOG_PAGE)
        return Response(StepLogSerializer(scripts.read_log(step_run, offset, limit)).data)

    def _answer(self, request: Request, step_name: str, approve: bool) -> Response:
        run = self.get_object()
        step = StepRun.objects.filter(run=run, name=step_name).first()
        if step is None:
            raise exceptions.NotFound("The run has no step by this name.")
        if not may(request.user, Action.APPROVE, run.workflow):
            raise exceptions.PermissionDenied(
                "Answering approvals needs the permission to approve them (workflows.approve_steprun)."
            )
        try:
            engine.answer(step, request.user, approve)
        except Conflict as exc:
            raise ConflictError(str(exc)) from None
        return Response(WorkflowRunSerializer(_run(run.pk)).data)
