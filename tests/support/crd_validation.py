"""What the API server does with a custom resource before it stores it, done client-side.

The Kubernetes emulator has no admission at all, so tests validate objects here: structural
defaulting, the OpenAPI schema (jsonschema, strict about unknown fields as kubectl is), and
every CEL rule (``x-kubernetes-validations``) evaluated with cel-python, with the part of
Kubernetes' CEL quantity library our rules use (``quantity``, ``isQuantity``, ``compareTo``,
``add``, ``isLessThan``, ``isGreaterThan``). The quantity parser here is written from Kubernetes'
documented quantity format, independently of the operator's quantities.py.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import total_ordering
from typing import Any

import celpy
import jsonschema
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

JsonSchema = dict[str, Any]

_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@total_ordering
@dataclass(frozen=True)
class Quantity:
    """A Kubernetes resource.Quantity as CEL sees it (exact value)."""

    value: Fraction

    @classmethod
    def parse(cls, text: str) -> Quantity:
        match = _QUANTITY.match(text)
        if match is None:
            raise ValueError(f"quantities must match the regular expression: {text!r}")
        number, suffix = Fraction(match.group(1)), match.group(2) or ""
        if suffix in _BINARY:
            return cls(number * 1024 ** _BINARY[suffix])
        if suffix in _DECIMAL:
            return cls(number * Fraction(10) ** _DECIMAL[suffix])
        return cls(number * Fraction(10) ** int(suffix[1:]))

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity.parse(str(text))
    except ValueError as error:
        raise CELEvalError(str(error)) from error


def _is_quantity(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_QUANTITY.match(str(text)) is not None)


def _add(left: Quantity, right: Any) -> Quantity:
    """Quantity.add: another quantity, or an integer in base units (bytes)."""
    addend = right.value if isinstance(right, Quantity) else Fraction(int(right))
    return Quantity(left.value + addend)


def _compare_to(left: Quantity, right: Quantity) -> celtypes.IntType:
    return celtypes.IntType((left.value > right.value) - (left.value < right.value))


KUBERNETES_FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare_to,
    "add": _add,
    "isLessThan": lambda left, right: celtypes.BoolType(left.value < right.value),
    "isGreaterThan": lambda left, right: celtypes.BoolType(left.value > right.value),
}


@dataclass(frozen=True)
class Rule:
    """One x-kubernetes-validations entry at one place of the schema."""

    path: str
    rule: str
    message: str | None
    message_expression: str | None
    field_path: str | None


def apply_defaults(schema: JsonSchema, value: Any) -> Any:
    """Structural defaulting as the API server does it: absent fields get their default."""
    if schema.get("type") == "object" and isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_defaults(child, value[name])
    elif schema.get("type") == "array" and isinstance(value, list):
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def rules_of(schema: JsonSchema, path: str = "") -> Iterator[Rule]:
    for entry in schema.get("x-kubernetes-validations", []):
        yield Rule(
            path or "<root>",
            entry["rule"],
            entry.get("message"),
            entry.get("messageExpression"),
            entry.get("fieldPath"),
        )
    for name, child in schema.get("properties", {}).items():
        yield from rules_of(child, f"{path}.{name}")
    if "items" in schema:
        yield from rules_of(schema["items"], f"{path}[]")


class CelRules:
    """Compiles every rule of a schema once; evaluates them against objects."""

    def __init__(self, schema: JsonSchema) -> None:
        self.schema = schema
        self.environment = celpy.Environment()
        self._programs: dict[str, Any] = {}
        self.rules = list(rules_of(schema))
        for rule in self.rules:
            self.program(rule.rule)
            if rule.message_expression:
                self.program(rule.message_expression)

    def program(self, expression: str) -> Any:
        if expression not in self._programs:
            ast = self.environment.compile(expression)
            self._programs[expression] = self.environment.program(
                ast, functions=KUBERNETES_FUNCTIONS
            )
        return self._programs[expression]

    def evaluate(self, expression: str, value: Any) -> Any:
        return self.program(expression).evaluate({"self": json_to_cel(value)})

    def errors(self, value: Any, schema: JsonSchema | None = None, path: str = "") -> list[str]:
        """Messages of the rules that fail, as the API server would word them."""
        schema = self.schema if schema is None else schema
        found: list[str] = []
        for entry in schema.get("x-kubernetes-validations", []):
            found.extend(self._check(entry, value, path))
        if isinstance(value, dict):
            for name, child in schema.get("properties", {}).items():
                if name in value:
                    found.extend(self.errors(value[name], child, f"{path}.{name}"))
        if isinstance(value, list) and "items" in schema:
            for index, item in enumerate(value):
                found.extend(self.errors(item, schema["items"], f"{path}[{index}]"))
        return found

    def _check(self, entry: dict[str, Any], value: Any, path: str) -> list[str]:
        where = path + (entry.get("fieldPath") or "")
        try:
            result = self.evaluate(entry["rule"], value)
        except CELEvalError as error:
            return [f"{where}: rule error: {error}"]
        if isinstance(result, CELEvalError):
            return [f"{where}: rule error: {result}"]
        if bool(result):
            return []
        message = entry.get("message") or f"failed rule: {entry['rule']}"
        if entry.get("messageExpression"):
            evaluated = self.evaluate(entry["messageExpression"], value)
            if isinstance(evaluated, str) and evaluated.strip():
                message = str(evaluated)
        return [f"{where}: Invalid value: {message}"]


class ApiServerValidation:
    """Defaulting, schema and CEL rules, in the API server's order, for one resource schema."""

    def __init__(self, schema: JsonSchema, strict_schema: JsonSchema) -> None:
        self.schema = schema
        self.validator = jsonschema.Draft202012Validator(strict_schema)
        self.cel = CelRules(schema)

    def defaulted(self, obj: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = apply_defaults(self.schema, copy.deepcopy(obj))
        return result

    def errors(self, obj: dict[str, Any]) -> list[str]:
        """Every reason the API server would refuse ``obj``; empty when it would store it."""
        defaulted = self.defaulted(obj)
        schema_errors = [error.message for error in self.validator.iter_errors(defaulted)]
        if schema_errors:
            return schema_errors  # CEL rules run only on objects that pass the schema
        return self.cel.errors(defaulted)
