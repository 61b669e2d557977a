"""The Prometheus alerting rules (charts/unwind/files/unwind-alerts.yaml): valid for promtool,
firing as their promtool unit tests say, reading only metrics the code exports, and each
pointing at a section of the runbook that exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import unwind.operator.metrics  # noqa: F401  (registers the operator's metrics in REGISTRY)
from unwind.gateway.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "charts" / "unwind" / "files" / "unwind-alerts.yaml"
RULE_TESTS = ROOT / "tests" / "alerts" / "unwind-alerts.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMETHEUS_OWN = {"up"}  # written by Prometheus for every scrape target, not by the code

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool is not installed (Debian package prometheus; scripts/install.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: every identifier that is not a function or
    aggregation (followed by '('), a keyword, a label (inside {...} or by/on/... (...)), a
    string, a number or a duration."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", text):
        if text[match.end():].lstrip().startswith("(") or match.group(0).lower() in KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def exported(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry's metrics can expose."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("", "_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",),
                "gaugehistogram": ("_bucket", "_gcount", "_gsum"), "stateset": ("",), "unknown": ("",)}
    return {metric.name + suffix for metric in registry.collect()
            for suffix in suffixes[metric.type]}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def unknown_metrics(rule_list: list[dict[str, Any]]) -> dict[str, set[str]]:
    known = exported(REGISTRY) | exported(Metrics().registry) | PROMETHEUS_OWN
    found = {rule["alert"]: metric_names(str(rule["expr"])) - known for rule in rule_list}
    return {alert: names for alert, names in found.items() if names}


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


# --- promtool ------------------------------------------------------------------------------


def test_promtool_accepts_the_alerting_rules() -> None:
    proc = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_each_alert_fires_on_its_cause_and_not_on_its_neighbours() -> None:
    """promtool's unit tests of the rules (tests/alerts/unwind-alerts.test.yaml)."""
    proc = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the metrics the rules read ------------------------------------------------------------


def test_every_metric_the_rules_read_is_one_the_operator_or_the_gateway_exports() -> None:
    assert unknown_metrics(rules()) == {}


def test_a_rule_reading_a_metric_nobody_exports_is_named() -> None:
    made_up = [{"alert": "Typo", "expr": 'sum(rate(unwind_reconcile_total{result="error"}[5m])) > 0'},
               {"alert": "Fine", "expr": "unwind_gateway_catalogue_ready == 0"}]
    assert unknown_metrics(made_up) == {"Typo": {"unwind_reconcile_total"}}


def test_the_metric_reader_skips_functions_keywords_labels_strings_and_durations() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, job) (rate(a_seconds_bucket{code!="x_y"}[5m] '
            'offset 1h))) > 1e3 and on(instance) group_left(tool) b_total / ignoring(code) c '
            'unless absent(up{job="j"} == 1)')
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c", "up"}


def test_the_gateway_and_operator_registries_hold_the_documented_names() -> None:
    """A guard on the reader of the registries: what docs/operator.md and docs/gateway.md list."""
    names = exported(REGISTRY) | exported(Metrics().registry)
    assert {"unwind_reconciles_total", "unwind_reconcile_seconds_bucket",
            "unwind_bundle_publish_latency_seconds_bucket", "unwind_ledgers_checked_total",
            "unwind_gateway_calls_total", "unwind_gateway_ledger_failures_total",
            "unwind_gateway_catalogue_refusals_total", "unwind_gateway_catalogue_ready",
            "unwind_gateway_ledger_write_seconds_bucket",
            "unwind_gateway_observed_violations_total"} <= names


# --- what an alert says --------------------------------------------------------------------


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section_that_exists() -> None:
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), re.M)}
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/runbook.md" and anchor in anchors, (rule["alert"], anchor)
