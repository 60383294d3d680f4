"""Fixtures shared by the integration tests of one concern (beside tests/conftest.py's
servers): ``breaker``, the claims of a poller with a short circuit breaker."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.rows.claims import Claims
from poller.rules.health import HealthPolicy


@pytest.fixture
def breaker(aengine: AsyncEngine) -> Claims:
    policy = HealthPolicy(circuit_failures=3, circuit_cooldown=0.3, circuit_cooldown_max=0.6)
    return Claims(aengine, poller_id="p1", claim_lease=30, health=policy)
