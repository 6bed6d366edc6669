"""A campaign file (``effectq campaign submit FILE``, ``POST /v1/campaigns``): its strict
shape, and reading one without loading it whole."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints

from dedupe import MessageError

__all__ = ["MAX_RECIPIENTS", "CampaignFile", "CampaignHeader", "CampaignSource"]

MAX_RECIPIENTS = 1_000_000


class CampaignHeader(BaseModel):
    """A campaign file without its recipients."""

    model_config = ConfigDict(strict=True, extra="forbid")

    campaign_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    tool: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    action: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    args: dict[str, JsonValue] = {}
    plan_version: Annotated[int, Field(ge=1)] | None = None


class CampaignFile(CampaignHeader):
    """``effectq campaign submit FILE`` and ``POST /v1/campaigns``: the strict shape."""

    recipients: Annotated[list[JsonValue], Field(min_length=1, max_length=MAX_RECIPIENTS)]


class _RecipientCount(BaseModel):
    recipients: Annotated[int, Field(ge=1, le=MAX_RECIPIENTS)]


class CampaignSource:
    """A campaign file read without loading it whole: ``open`` parses it once with ijson
    (the whole file checked as JSON, the header validated, the recipients counted, never
    held), ``recipients()`` streams them from a second read. Numbers parse as ``json``
    parses them (an int, or a float)."""

    def __init__(self, path: str, header: CampaignHeader, count: int) -> None:
        self.path, self.header, self.count = path, header, count

    @classmethod
    def open(cls, path: str) -> CampaignSource:
        """Raises OSError; pydantic's ValidationError (the header, or ``recipients`` not a
        list of 1 to ``MAX_RECIPIENTS``); MessageError (not JSON in UTF-8, a field given
        twice)."""
        import ijson  # type: ignore[import-untyped]

        try:
            with open(path, "rb") as f:
                header, count = _header(ijson.parse(f, use_float=True))
        except ijson.JSONError:  # its message quotes the text: never echoed
            raise MessageError("the campaign file is not JSON in UTF-8") from None
        return cls(path, header, count)

    def recipients(self) -> Iterator[Any]:
        import ijson

        try:
            with open(self.path, "rb") as f:
                yield from ijson.items(f, "recipients.item", use_float=True)
        except ijson.JSONError:  # changed since it was checked
            raise MessageError("the campaign file is not JSON in UTF-8") from None


def _header(events: Iterator[tuple[str, str, Any]]) -> tuple[CampaignHeader, int]:
    fields: dict[str, Any] = {}
    count: int | None = None
    first = next(events, None)
    if first is None or first[1] != "start_map":
        CampaignHeader.model_validate(None)  # raises: not an object
    for prefix, event, name in events:
        if prefix == "" and event == "end_map":
            break
        if name in fields or (name == "recipients" and count is not None):
            raise MessageError("campaign file: a field is given twice")
        if name != "recipients":
            fields[name] = _value(events)
            continue
        head = next(events)
        if head[1] != "start_array":  # the model's error for what it is instead
            value = _value(itertools.chain([head], events))
            CampaignFile.model_validate({**fields, "recipients": value})
        count = _items(events)
    if count is None:
        CampaignFile.model_validate(fields)  # raises: recipients missing
    header = CampaignHeader.model_validate(fields)
    _RecipientCount.model_validate({"recipients": count})
    return header, count or 0


def _value(events: Iterator[tuple[str, str, Any]]) -> Any:
    """The next JSON value of ``events``, built."""
    import ijson

    builder = ijson.ObjectBuilder()
    depth = 0
    for _, event, value in events:
        builder.event(event, value)
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
        if depth == 0:
            return builder.value
    raise MessageError("campaign file: truncated")


def _items(events: Iterator[tuple[str, str, Any]]) -> int:
    """Count the items of the list whose start ``events`` just gave, skipping to its end."""
    count = depth = 0
    for _, event, _ in events:
        if depth == 0:
            if event == "end_array":
                return count
            count += 1
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
    raise MessageError("campaign file: truncated")
