"""A sandbox's environment in the Pod API's shapes: plain ``env`` values, values
from a key of a Secret or ConfigMap in the sandbox's namespace
(``env[].valueFrom``), and every key of one (``envFrom``, with a prefix).

References are resolved on the sandbox's node from the copy the operator brokers
to that node alone (``policy.envrefs``, docs/isolation.md); the values are never
written into the Sandbox or its status.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from sandlot.api.common import MAX_ENV_VALUE, MAX_NAME, MAX_WORD, Model

# A key of a Secret's or ConfigMap's data (Kubernetes' IsConfigMapKey).
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
MAX_CONFIG_KEY = 253
MAX_ENV_FROM = 64

_ONE_SOURCE: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "[has(self.secretKeyRef), has(self.configMapKeyRef)].filter(x, x).size() == 1",
            "message": "valueFrom has exactly one of secretKeyRef, configMapKeyRef",
            "reason": "FieldValueInvalid",
        }
    ]
}
_VALUE_OR_FROM: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "!(has(self.valueFrom) && has(self.value) && self.value != '')",
            "message": "value may not be specified when valueFrom is",
            "reason": "FieldValueInvalid",
        }
    ]
}
_ONE_REF: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "[has(self.secretRef), has(self.configMapRef)].filter(x, x).size() == 1",
            "message": "envFrom entries have exactly one of secretRef, configMapRef",
            "reason": "FieldValueInvalid",
        }
    ]
}


class KeySelector(Model):
    """One key of a Secret or ConfigMap in the sandbox's namespace."""

    name: str = Field(min_length=1, max_length=MAX_NAME, description="Name of the object.")
    key: str = Field(
        min_length=1,
        max_length=MAX_CONFIG_KEY,
        pattern=CONFIG_KEY_PATTERN,
        description="The key whose value is the variable's.",
    )
    optional: bool | None = Field(
        default=None,
        description="true: a missing object or key leaves the variable out instead of "
        "holding the sandbox back (CreateContainerConfigError).",
    )


class EnvVarSource(Model):
    model_config = Model.model_config | {"json_schema_extra": _ONE_SOURCE}

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(
        default=None, description="A key of a ConfigMap."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("valueFrom has exactly one of secretKeyRef, configMapKeyRef")
        return self


class EnvVar(Model):
    model_config = Model.model_config | {"json_schema_extra": _VALUE_OR_FROM}

    name: str = Field(
        min_length=1, max_length=MAX_WORD, description="Name of the environment variable."
    )
    value: str = Field(default="", max_length=MAX_ENV_VALUE, description="Its value.")
    value_from: EnvVarSource | None = Field(
        default=None,
        description="Its value from a key of a Secret or ConfigMap in the sandbox's "
        "namespace, handed only to the sandbox's node (docs/isolation.md).",
    )

    @model_validator(mode="after")
    def _value_or_from(self) -> EnvVar:
        if self.value and self.value_from is not None:
            raise ValueError(f"env {self.name}: value may not be specified when valueFrom is")
        return self


class ObjectRef(Model):
    """A whole Secret or ConfigMap in the sandbox's namespace."""

    name: str = Field(min_length=1, max_length=MAX_NAME, description="Name of the object.")
    optional: bool | None = Field(
        default=None,
        description="true: a missing object adds nothing instead of holding the "
        "sandbox back (CreateContainerConfigError).",
    )


class EnvFromSource(Model):
    model_config = Model.model_config | {"json_schema_extra": _ONE_REF}

    prefix: str = Field(
        default="",
        max_length=MAX_WORD,
        description="Put before every key's name to make the variable's.",
    )
    secret_ref: ObjectRef | None = Field(default=None, description="Every key of a Secret.")
    config_map_ref: ObjectRef | None = Field(default=None, description="Every key of a ConfigMap.")

    @model_validator(mode="after")
    def _one_ref(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom entries have exactly one of secretRef, configMapRef")
        return self


__all__ = [
    "MAX_ENV_FROM",
    "EnvFromSource",
    "EnvVar",
    "EnvVarSource",
    "KeySelector",
    "ObjectRef",
]
