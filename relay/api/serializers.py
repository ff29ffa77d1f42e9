from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, models, transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
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


class StrictBooleanField(serializers.BooleanField):
    """Only JSON true or false: "yes", 1 or "false" are client bugs, not booleans."""

    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StoredJSONField(serializers.JSONField):
    """Any JSON that PostgreSQL can store: its jsonb refuses a NUL character (\\u0000) in any
    string or key, which would otherwise be a database error when the row is saved."""

    default_error_messages = {"null_character": "Null characters (\\u0000) are not allowed."}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        pending = [value]  # a loop, not recursion: the depth of a document is the client's
        while pending:
            item = pending.pop()
            if isinstance(item, dict):
                pending.extend(item.keys())
                pending.extend(item.values())
            elif isinstance(item, list):
                pending.extend(item)
            elif isinstance(item, str) and "\x00" in item:
                self.fail("null_character")
        return value


class JSONObjectField(StoredJSONField):
    default_error_messages = {"not_an_object": "Must be a JSON object."}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            self.fail("not_an_object")
        return super().to_internal_value(data)


class RejectUnknownFields:
    """A mixin for serializers whose callers must hear about a misspelt field, instead of
    having it silently ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))  # type: ignore[attr-defined]
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown}, "unknown")
        return super().to_internal_value(data)  # type: ignore[misc]


class OwnedSerializer(StrictModelSerializer):
    """A row a user owns (a connection, a trigger): `name` unique per owner."""

    owner = serializers.CharField(source="owner.get_username", read_only=True)

    def validate_name(self, name: str) -> str:
        # Unique per owner: the holder's owner when it is renamed (perhaps by staff), the
        # requester when it is created.
        owner = self.instance.owner if self.instance is not None else self.context["request"].user
        taken = self.namesakes(owner).filter(name=name)
        if self.instance is not None:
            taken = taken.exclude(pk=self.instance.pk)
        if taken.exists():
            raise serializers.ValidationError(self.name_taken(owner), "unique")
        return name

    def namesakes(self, owner: AbstractBaseUser) -> models.QuerySet:
        """The holders whose names a holder of `owner`'s must differ from."""
        return self.Meta.model._default_manager.filter(owner=owner)

    def name_taken(self, owner: AbstractBaseUser) -> str:
        who = (
            "You already have"
            if owner == self.context["request"].user
            else f"{owner.get_username()} already has"
        )
        return f"{who} a {self.Meta.model._meta.verbose_name} with this name."

    def update(self, instance: Any, validated_data: dict[str, Any]) -> Any:
        try:
            with transaction.atomic():
                return super().update(instance, validated_data)
        except IntegrityError:
            # Lost a race with a concurrent rename to the same name.
            raise serializers.ValidationError({"name": [self.name_taken(instance.owner)]}, "unique") from None


class TokenHolderSerializer(OwnedSerializer):
    """A connection or trigger with a token of ours: created with a new token."""

    token_prefix = serializers.CharField(read_only=True)

    def pop_secret(self, validated_data: dict[str, Any]) -> dict[str, str]:
        """Values that belong in the holder's Vault secret, not its row (none by default)."""
        return {}

    def create(self, validated_data: dict[str, Any]) -> Any:
        model = self.Meta.model
        secret = self.pop_secret(validated_data)
        try:
            holder, token = model.create_with_token(
                owner=self.context["request"].user, secret=secret, **validated_data
            )
        except IntegrityError:
            # Lost a race with a concurrent create of the same name.
            raise serializers.ValidationError(
                {"name": [self.name_taken(self.context["request"].user)]}, "unique"
            ) from None
        self.context["token"] = token
        return holder


@extend_schema_field(OpenApiTypes.STR)
class TokenField(serializers.Field):
    """The plain token, from the context: only in the answers to create and regenerate."""

    def __init__(self) -> None:
        super().__init__(source="*", read_only=True)

    def to_representation(self, value: Any) -> str:
        return str(self.context["token"])
