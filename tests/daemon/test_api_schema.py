"""Schemathesis against the daemon's own OpenAPI, on a real socket: every operation, with
data the schema allows and data it does not, with the admin's key, a viewer's or none —
never a 5xx, and every answer as the schema says (status, content type, body). (Schema-
violating data need not be refused in every part: unknown query parameters are ignored, as
FastAPI does.) A bounded
budget: ``LABD_SCHEMA_EXAMPLES`` cases (25 by default) per operation and mode."""

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from labd.daemon.access import Access, ApiSettings
from tests.labs import meter, metered, switch
from tests.rigs import background_rig

EXAMPLES = int(os.environ.get("LABD_SCHEMA_EXAMPLES", "25"))
ADMIN, OPERATOR, VIEWER = "t", "operator-token-0123456789", "viewer-token-0123456789"
HOST = "host-h1-token-0123456789"
#: Every kind of key, so that each boundary (viewer/operator, operator/admin, a host key and
#: the rest) is fuzzed.
KEYS = {"admin": {"Authorization": f"Bearer {ADMIN}"},
        "operator": {"Authorization": f"Bearer {OPERATOR}"},
        "viewer": {"Authorization": f"Bearer {VIEWER}"},
        "host": {"Authorization": f"Bearer {HOST}"}, "none": {}}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
LAB = (switch(switch_ms=1, size="8x8"), meter(), metered("a", "b", 1, 9, 1))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_keeps_to_its_schema_whatever_it_is_sent(tmp_path: Path,
                                                         mode: GenerationMode) -> None:
    access = Access.parse({"key": [{"role": "viewer", "token": VIEWER},
                                   {"role": "operator", "token": OPERATOR},
                                   {"host": "h1", "token": HOST}]}, "test")
    with background_rig(tmp_path, "schema", *LAB, api=ApiSettings(access=access),
                        light_window_s=0.01) as bg:
        url = bg.daemon.url
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()
                      if isinstance(result, Ok)]
        assert len(operations) == 37
        failures: list[str] = []
        statuses: Counter[int] = Counter()
        for operation in operations:

            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode),
                   key=st.sampled_from(["admin", "admin", "admin", "operator", "operator",
                                        "viewer", "host", "none"]))
            def check(case: Any, key: str) -> None:
                response = case.call(base_url=url, headers=KEYS[key])
                statuses[response.status_code] += 1
                try:
                    case.validate_response(response, checks=CHECKS)
                except Exception as failure:  # all of them told at the end
                    failures.append(f"{case.method} {case.formatted_path} ({key}): "
                                    f"{str(failure)[:600]}")

            check()
        print(f"schemathesis ({mode.value}): {statuses.total()} cases on {len(operations)} "
              f"operations; statuses {dict(sorted(statuses.items()))}")
        assert not failures, "\n".join(failures[:10])
        # not vacuous: cases got past the edge, and some were turned away at it
        assert statuses[200] and statuses[401] and statuses[403], statuses
