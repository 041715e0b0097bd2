#!/usr/bin/env python3
"""Checks socklb's monitoring files; exits non-zero on any problem.

- prometheusrule.yaml's spec.groups are exactly rules.yaml's groups (rules.yaml is the one
  source; `check.py --write` regenerates prometheusrule.yaml from it);
- every alert has a severity (critical, warning or info), a summary, a description and the
  runbook_url of its section in docs/runbook.md;
- rules-test.yaml has, for every alert, a case where it fires and one where it stays quiet;
- `promtool check rules rules.yaml` and `promtool test rules rules-test.yaml` pass;
- every PromQL expression of dashboard.json parses (promtool, as recording rules, with the
  dashboard's variables replaced by plain values);
- docs/runbook.md has a "### <alertname>" heading per alert (under headings of its own that
  group them), each with a section that says what the alert means and the fix, and no such
  heading for an alert that does not exist.

promtool: $PROMTOOL, else /usr/local/bin/promtool, else the one on PATH.
Run from anywhere: `python3 deploy/monitoring/check.py [--write]`.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RULES = os.path.join(HERE, "rules.yaml")
CRD = os.path.join(HERE, "prometheusrule.yaml")
TESTS = os.path.join(HERE, "rules-test.yaml")
DASHBOARD = os.path.join(HERE, "dashboard.json")
RUNBOOK = os.path.join(ROOT, "docs", "runbook.md")
RUNBOOK_BASE = "https://github.com/socklb/socklb/blob/main/docs/runbook.md#"
SEVERITIES = {"critical", "warning", "info"}

CRD_HEADER = """\
# Generated from rules.yaml by `python3 deploy/monitoring/check.py --write`: edit rules.yaml,
# not this file (check.py fails when the two differ). The Prometheus Operator picks it up when
# its ruleSelector matches these labels (kube-prometheus-stack: add `release: <helm release>`,
# or set ruleSelectorNilUsesHelmValues=false).
"""

CRD_METADATA = {
    "name": "socklb",
    "namespace": "kube-system",
    "labels": {
        "app.kubernetes.io/name": "socklb",
        "app.kubernetes.io/component": "agent",
    },
}


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def alerts(groups):
    for group in groups:
        for rule in group.get("rules") or []:
            if "alert" in rule:
                yield rule


class Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    # Long annotations and expressions folded as rules.yaml writes them (`>-`), so the file
    # reads like the source; multi-line text (none today) as a literal block.
    style = "|" if "\n" in value else (">" if len(value) > 80 else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def write_crd(groups):
    crd = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": CRD_METADATA,
        "spec": {"groups": groups},
    }
    with open(CRD, "w", encoding="utf-8") as f:
        f.write(CRD_HEADER)
        yaml.dump(crd, f, Dumper=Dumper, sort_keys=False, width=100, allow_unicode=True)


def promtool():
    candidates = [os.environ.get("PROMTOOL"), "/usr/local/bin/promtool", shutil.which("promtool")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def run(problems, args, cwd):
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    said = (out.stdout + out.stderr).strip()
    print(f"$ {' '.join(args)}\n{said}\n")
    if out.returncode != 0:
        problems.append(f"`{' '.join(args)}` exited {out.returncode}")


def check_alerts(problems, groups):
    names = []
    for rule in alerts(groups):
        name = rule["alert"]
        names.append(name)
        if not re.fullmatch(r"Socklb[A-Z][A-Za-z]+", name):
            problems.append(f"{name}: alert names are CamelCase and start with Socklb")
        severity = (rule.get("labels") or {}).get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{name}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
        annotations = rule.get("annotations") or {}
        for key in ("summary", "description", "runbook_url"):
            if not annotations.get(key):
                problems.append(f"{name}: no {key} annotation")
        want = RUNBOOK_BASE + name.lower()
        if annotations.get("runbook_url") != want:
            problems.append(f"{name}: runbook_url is not {want}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"alerts defined twice: {duplicates}")
    return names


def check_tests_cover(problems, names):
    tests = load_yaml(TESTS)
    if tests.get("rule_files") != ["rules.yaml"]:
        problems.append("rules-test.yaml: rule_files must be [rules.yaml]")
    fires, quiet = set(), set()
    for case in tests.get("tests") or []:
        for alert_case in case.get("alert_rule_test") or []:
            name = alert_case.get("alertname")
            if alert_case.get("exp_alerts"):
                fires.add(name)
            else:
                quiet.add(name)
    for name in names:
        if name not in fires:
            problems.append(f"rules-test.yaml: no case where {name} fires")
        if name not in quiet:
            problems.append(f"rules-test.yaml: no case where {name} stays quiet")
    for name in sorted((fires | quiet) - set(names)):
        problems.append(f"rules-test.yaml: tests {name}, which rules.yaml does not define")


def dashboard_panels(panels):
    for panel in panels or []:
        yield panel
        yield from dashboard_panels(panel.get("panels"))


def substitute(expr):
    """A Grafana expression with its variables replaced by values PromQL parses."""
    for var, value in (("__rate_interval", "5m"), ("__interval", "1m"), ("__range", "1h")):
        expr = expr.replace("${" + var + "}", value).replace("$" + var, value)
    return re.sub(r"\$\{\w+(?::\w+)?\}|\$\w+", "x", expr)


def dashboard_exprs():
    with open(DASHBOARD, encoding="utf-8") as f:
        dashboard = json.load(f)
    for panel in dashboard_panels(dashboard.get("panels")):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                yield f"{panel.get('title')} [{target.get('refId')}]", target["expr"]


def check_dashboard(problems, tool, scratch):
    rules = []
    for i, (where, expr) in enumerate(dashboard_exprs()):
        # The rule's name says which panel a promtool error is about.
        name = re.sub(r"[^A-Za-z0-9_]+", "_", where).strip("_").lower()
        rules.append({"record": f"dashboard:{name}:{i}", "expr": substitute(expr)})
    print(f"dashboard.json: {len(rules)} expressions")
    if not rules:
        problems.append("dashboard.json: no expressions found")
        return
    path = os.path.join(scratch, "dashboard-rules.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)
    run(problems, [tool, "check", "rules", path], scratch)


def check_runbook(problems, names):
    where = os.path.relpath(RUNBOOK, ROOT)
    try:
        with open(RUNBOOK, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        problems.append(f"{where}: cannot be read ({e})")
        return
    # Outside fenced code blocks only: a "### " line in a shell example is no heading.
    text = re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.M | re.S)
    # A section runs from its "### <alertname>" heading to the next heading of any level.
    found = re.findall(r"^### (\S+)[ \t]*\n(.*?)(?=^#{1,3} |\Z)", text, re.M | re.S)
    sections = {}
    for name, body in found:
        if name in sections:
            problems.append(f"{where}: \"### {name}\" appears twice")
        sections[name] = body
    for name in names:
        if name not in sections:
            problems.append(f"{where}: no \"### {name}\" section")
        elif "**Fix:**" not in sections[name] or "**Means:**" not in sections[name]:
            problems.append(f"{where}: the runbook of {name} does not say what it means and the fix")
    for name in sections:
        if name not in names:
            problems.append(f"{where}: runbook section {name} for an alert that does not exist")


def main():
    problems = []
    groups = load_yaml(RULES)["groups"]
    if "--write" in sys.argv[1:]:
        write_crd(groups)
        print(f"wrote {os.path.relpath(CRD)}")
    crd = load_yaml(CRD)
    if crd.get("kind") != "PrometheusRule" or crd.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append("prometheusrule.yaml: not a monitoring.coreos.com/v1 PrometheusRule")
    if (crd.get("spec") or {}).get("groups") != groups:
        problems.append(
            "prometheusrule.yaml: spec.groups differ from rules.yaml's groups "
            "(run `python3 deploy/monitoring/check.py --write`)"
        )
    names = check_alerts(problems, groups)
    check_tests_cover(problems, names)
    check_runbook(problems, names)
    tool = promtool()
    if tool is None:
        problems.append("promtool not found (set $PROMTOOL, or `cargo xtask setup`)")
    else:
        run(problems, [tool, "check", "rules", "rules.yaml"], HERE)
        run(problems, [tool, "test", "rules", "rules-test.yaml"], HERE)
        with tempfile.TemporaryDirectory() as scratch:
            check_dashboard(problems, tool, scratch)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print(f"{len(names)} alerts; {'FAILED' if problems else 'ok'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
