"""schemathesis against the committed OpenAPI document, with the service running over real
workers: no 5xx, every answer as documented (status, content type, schema, headers), auth
never ignored. Bounded to a few examples per operation to keep the suite quick."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from tests.api.conftest import ROLES, Api
from workers.dev.local import LocalStack

# A schema-valid call can still name no effect (an unknown tool, a recipient that is not an
# address): the document says so with 422, and positive data may be answered with it.
# The token goes through schemathesis's own auth, so it knows a request without one is
# meant to be refused (and checks that it is: ignored_auth).
CONFIG = SchemathesisConfig.from_str(f"""
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "422", "423"]

[auth.openapi.HTTPBearer]
bearer = "{ROLES["root"][0]}"
""")
schema = schemathesis.openapi.from_path(
    Path(__file__).resolve().parents[2] / "docs" / "openapi.json", config=CONFIG
)


@pytest.fixture(scope="module")
def target(api: Api, stack: LocalStack) -> Iterator[Api]:
    """The API over a clean ledger and one worker pool (so ?wait= ends in a receipt)."""
    redis.Redis.from_url(stack.ledger_url).flushall()
    stack.start_workers(1, 4)
    yield api
    stack.stop_processes()


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_committed_document(target: Api, case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(base_url=target.url)
