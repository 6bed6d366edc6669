"""A LangChain chat model that plays a script instead of calling a provider (no network):
each step is the ``AIMessage`` one model call answers. Every request is recorded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field


def charge_call(call_id: str, **args: Any) -> AIMessage:
    """The model asking for one ``charge`` call under ``call_id``."""
    return AIMessage(content="", tool_calls=[{"id": call_id, "name": "charge", "args": args}])


class ScriptedChat(BaseChatModel):
    script: list[AIMessage] = Field(default_factory=list)
    requests: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.requests.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])
