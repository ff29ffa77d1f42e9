from rest_framework import serializers


class DocumentErrorSerializer(serializers.Serializer):
    """One problem in a workflow document (for the schema; the views answer plain dicts)."""

    pointer = serializers.CharField(help_text="JSON Pointer into the document, e.g. #/steps/0/image")
    line = serializers.IntegerField(allow_null=True, help_text="1-based line of that node")
    column = serializers.IntegerField(allow_null=True, help_text="1-based column of that node")
    detail = serializers.CharField()
