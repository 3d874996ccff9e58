"""Plugin parameters: pydantic models and dataclasses, camelCase keys, unknown keys, readable errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, Field

from picker.plugins.params import NoParams, ParamsError, PluginParams, is_params_type, parse_params


class Model(PluginParams):
    max_items: int = Field(default=3, ge=1)
    label: str = "zone"


class PlainModel(BaseModel):
    max_items: int = 3


@dataclass(frozen=True)
class Data:
    header_name: str = "x-tenant"
    weights: tuple[float, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)


def test_plugin_params_take_camel_case_and_snake_case() -> None:
    assert parse_params(Model, {"maxItems": 5}).value == Model(max_items=5)
    assert parse_params(Model, {"max_items": 6}).value == Model(max_items=6)
    assert parse_params(Model, None).value == Model()
    assert parse_params(NoParams, {}).value == NoParams()


def test_a_plain_pydantic_model_uses_its_own_names() -> None:
    parsed = parse_params(PlainModel, {"max_items": 4, "maxItems": 9})
    assert parsed.value == PlainModel(max_items=4)
    assert parsed.ignored == ["maxItems"]


def test_dataclass_fields_from_camel_case_keys_validated_and_coerced() -> None:
    parsed = parse_params(Data, {"headerName": "x-team", "weights": [1, "0.5"], "limits": {"a": "2"}, "colour": "red"})
    assert parsed.value == Data(header_name="x-team", weights=(1.0, 0.5), limits={"a": 2})
    assert isinstance(parsed.value, Data)
    assert parsed.ignored == ["colour"]


def test_unknown_keys_are_reported_not_fatal() -> None:
    assert parse_params(Model, {"maxItems": 2, "colour": "red"}).ignored == ["colour"]


@pytest.mark.parametrize(
    ("cls", "raw", "message"),
    [
        (Model, {"maxItems": 0}, "maxItems: Input should be greater than or equal to 1"),
        (Model, {"label": ["a"]}, "label: Input should be a valid string"),
        (Data, {"weights": ["x"]}, "weights.0: Input should be a valid number"),
        (Data, {"headerName": "a", "header_name": "b"}, "given twice"),
    ],
)
def test_bad_values_are_params_errors(cls: type, raw: dict[str, object], message: str) -> None:
    with pytest.raises(ParamsError) as info:
        parse_params(cls, raw)
    assert message in str(info.value)


def test_only_models_and_dataclasses_are_params_types() -> None:
    assert is_params_type(Model)
    assert is_params_type(Data)
    assert not is_params_type(dict)
    assert not is_params_type(Data())
    with pytest.raises(ParamsError):
        parse_params(dict, {})
