from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from relay.api.problems import PROBLEM_CONTENT_TYPE, problem
from workflows.api.parsers import WORKFLOW_DOCUMENT_PARSERS
from workflows.api.serializers import DocumentErrorSerializer
from workflows.dialect.validate import validate


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
            400: OpenApiResponse(
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
            ),
        },
    )
    def post(self, request: Request) -> Response:
        result = validate(request.data if isinstance(request.data, str) else "")
        if result.valid:
            body: dict[str, object] = {"valid": True}
            if result.warnings:
                body["warnings"] = [w.as_dict() for w in result.warnings]
            return Response(body)
        errors = [p.as_dict() for p in result.problems]
        detail = result.problems[0].detail if len(errors) == 1 else f"The workflow has {len(errors)} errors."
        body = problem(400, detail, "invalid_workflow", request.path, errors=errors)
        return Response(body, status=400, content_type=PROBLEM_CONTENT_TYPE)
