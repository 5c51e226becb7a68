"""Strict pydantic base for every cosmos-sana config table."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Unknown keys are errors, nan/inf are refused, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


class ComponentRef(StrictModel):
    """A plugin component picked by name, with its own ``args`` table.

    ``args`` is validated later against the component's ``params`` model, once
    the plugin that registered ``name`` is known.
    """

    name: str = Field(description="registered component name (see `cosmos-sana plugins`)")
    args: dict[str, Any] = Field(default_factory=dict, description="component-specific options")
