"""The Run button's form: one field per declared parameter, validated as the API validates a
run's parameters (workflows.engine.bind_parameters), its errors next to the fields."""

import json
from typing import Any

from django import forms

from relay.api.parsers import RefusedJSON, read_json
from workflows.dialect.workflow import Parameter

REQUIRED = "A required parameter has no value."  # the API's words (workflows.api.views)


def kind_of(parameter: Parameter) -> str:
    """What the field takes. Relay's parameters declare no type: a default other than a string
    says what is expected (typed as JSON); otherwise the value is text."""
    if not parameter.has_default or parameter.default is None or isinstance(parameter.default, str):
        return "text"
    if isinstance(parameter.default, bool):
        return "boolean"
    if isinstance(parameter.default, int | float):
        return "number"
    return "list" if isinstance(parameter.default, list) else "object"


class RunForm(forms.Form):
    def __init__(self, parameters: dict[str, Parameter], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parameters = parameters
        for name, parameter in parameters.items():
            kind = kind_of(parameter)
            initial = parameter.default if kind == "text" else json.dumps(parameter.default)
            field = forms.CharField(
                label=name,
                required=not parameter.has_default,
                initial=initial if parameter.has_default else None,
                help_text=parameter.description,
                strip=False,
                error_messages={"required": REQUIRED},
                widget=forms.TextInput(attrs={"autocomplete": "off"}),
            )
            field.kind = kind  # type: ignore[attr-defined]
            self.fields[name] = field

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        values: dict[str, Any] = {}
        for name, value in list(cleaned.items()):
            field = self.fields[name]
            if value in ("", None):
                continue  # not given: its default (a required one has its error already)
            if field.kind == "text":  # type: ignore[attr-defined]
                values[name] = value
                continue
            try:
                # The API's reader: nesting, NaN, numbers past a float64 refused as the API does.
                values[name] = read_json(value.encode())
            except RefusedJSON as exc:
                self.add_error(name, f"Not a {field.kind}: write it as JSON, like its default ({exc}).")  # type: ignore[attr-defined]
        self.values = values
        return cleaned
