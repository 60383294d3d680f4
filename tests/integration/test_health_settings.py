"""Endpoint health's settings: nasty values refused in one line (CLI, API), and the
health command."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from poller.endpoints.registry import update_endpoint
from poller.errors import InvalidEndpoint
from poller.rules.health import MIN_COOLDOWN, MIN_RATE
from tests.conftest import make_endpoint
from tests.integration.health_helpers import (
    cli_run,
    health,
)
from tests.integration.helpers import seed


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--rate-limit", "0"),
        ("--rate-limit", "-5"),
        ("--rate-limit", "nan"),
        ("--rate-limit", "inf"),
        ("--rate-limit", "1e400"),
        ("--rate-limit", "5e-324"),  # its token arithmetic underflowed in every claim
        ("--rate-limit", "fast"),
        ("--rate-burst", "0"),
        ("--rate-burst", "1.5"),
        ("--circuit-failures", "-1"),
        ("--circuit-failures", "99999999999"),
        ("--circuit-cooldown", "0"),
        ("--circuit-cooldown", "NaN"),
        ("--circuit-cooldown", "86401"),
        ("--circuit-cooldown", "5e-324"),  # a failing endpoint probed 10/s for minutes
    ],
)
def test_nasty_health_settings_are_refused_in_one_line(
    db_url: str, engine: Engine, option: str, value: str
) -> None:
    make_endpoint(engine, "billing")
    code, out = cli_run(db_url, "endpoints", "update", "billing", option, value)
    assert code == 2, out
    assert "Traceback" not in out and option in out
    assert health(engine).state == "closed"


def test_nasty_health_settings_are_refused_by_the_api(engine: Engine) -> None:
    make_endpoint(engine, "billing")
    for changes in (
        {"rate_limit": float("nan")},
        {"rate_limit": True},
        {"rate_burst": 2.5},
        {"circuit_failures": -1},
        {"circuit_cooldown": float("inf")},
        {"rate_limit": "50"},
        {"rate_limit": 5e-324},
        {"rate_limit": 0.000009},
        {"circuit_cooldown": 0.049},
    ):
        with Session(engine) as session, pytest.raises(InvalidEndpoint):
            update_endpoint(session, "billing", **changes)
    with Session(engine) as session, session.begin():
        update_endpoint(session, "billing", rate_limit=MIN_RATE)  # the floor: one a day
        update_endpoint(session, "billing", circuit_cooldown=MIN_COOLDOWN)


def test_health_settings_and_the_health_command(db_url: str, engine: Engine) -> None:
    make_endpoint(engine, "billing")
    code, out = cli_run(
        db_url,
        "endpoints",
        "update",
        "billing",
        "--rate-limit",
        "50",
        "--rate-burst",
        "10",
        "--circuit-failures",
        "0",
        "--json",
    )
    assert code == 0, out
    shown = json.loads(out)
    assert (shown["rate_limit"], shown["rate_burst"], shown["circuit_failures"]) == (50, 10, 0)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_endpoint_health SET state = 'open', opened_at = now(), "
                "open_until = now() + interval '30 s', consecutive_failures = 12, "
                "last_error = 'HTTP 503'"
            )
        )
    code, out = cli_run(db_url, "endpoints", "health", "billing", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["circuit"] == "open" and report["consecutive_failures"] == 12
    assert report["rate_limit"] == 50 and report["rate_burst"] == 10
    assert report["next_probe_at"] is not None and report["success_ratio_1h"] is None
    code, out = cli_run(db_url, "endpoints", "health")
    assert code == 0 and "circuit open" in out and "HTTP 503" in out, out
    code, out = cli_run(db_url, "admin", "stats", "--json")
    assert json.loads(out)["endpoint_states"] == {}  # no messages: no endpoint rows
    seed(engine, 2)
    code, out = cli_run(db_url, "admin", "stats")
    assert "circuit open" in out and "2 pending messages wait" in out, out
    code, out = cli_run(db_url, "endpoints", "enable", "billing")
    assert code == 0 and health(engine).state == "closed"
    code, out = cli_run(
        db_url, "endpoints", "update", "billing", "--rate-limit", "default", "--json"
    )
    assert json.loads(out)["rate_limit"] is None
    code, out = cli_run(db_url, "endpoints", "health", "nosuch")
    assert code == 1 and "nosuch" in out and "Traceback" not in out
