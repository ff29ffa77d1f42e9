from typing import Any

from django.db import models
from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A string field that refuses numbers and booleans instead of coercing them: a wrong
    type in a request is a client bug worth a 400, not something to guess at."""

    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictModelSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
    }
