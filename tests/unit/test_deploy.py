"""Deployment files: the compose file is valid and runs the tested commands; alerts are sound."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from poller.observe import metrics
from tests.conftest import repo_root

ROOT = repo_root()


def test_compose_file_validates_against_the_compose_spec() -> None:
    tool = shutil.which("check-jsonschema") or str(
        Path(__file__).parents[2] / ".venv/bin/check-jsonschema"
    )
    done = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_services_run_the_commands_the_acceptance_tests_run() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert services["migrate"]["command"] == ["db", "upgrade"]  # tests/acceptance/test_wheel.py
    assert services["poller"]["command"] == ["run"]  # tests/acceptance/test_run.py
    assert services["receiver"]["command"][0] == "receiver"  # tests/acceptance/procs.py
    assert services["poller"]["deploy"]["replicas"] == 2
    assert services["poller"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    env = services["poller"]["environment"]
    assert {"POLLER_DATABASE_URL", "POLLER_REDIS_URL", "POLLER_METRICS_ADDR"} <= set(env)


def _metric_names() -> set[str]:
    from prometheus_client.metrics import MetricWrapperBase

    from poller.observe.delivery_metrics import DeliveryMetrics

    names = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase | DeliveryMetrics):
            for family in value.describe():
                names.add(family.name)
                names.update(f"{family.name}{s}" for s in ("_total", "_bucket", "_count", "_sum"))
    return names


def test_alert_rules_are_well_formed_and_use_real_metrics() -> None:
    rules = [
        r
        for g in yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"]
        for r in g["rules"]
    ]
    assert {r["alert"] for r in rules} >= {
        "WebhookBacklogOld",
        "WebhooksFailingForGood",
        "WebhooksNotDelivering",
        "WebhookLeadershipChurn",
        "WebhookStaleWrites",
        "WebhookElectionBackendDown",
        "WebhookPollerDown",
    }
    known = _metric_names()
    for rule in rules:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        for name in re.findall(r"webhook_poller_\w+", rule["expr"]):
            assert name in known, f"{rule['alert']} uses unknown metric {name}"


@pytest.mark.parametrize("path", ["Dockerfile"])
def test_dockerfile_runs_as_non_root_with_the_poller_entrypoint(path: str) -> None:
    text = (ROOT / path).read_text()
    assert "USER poller" in text and 'ENTRYPOINT ["poller"]' in text
    assert text.count("FROM ") == 2  # multi-stage
    assert "'webhook-poller[server,otel]'" in text  # the service; exports traces when told to
