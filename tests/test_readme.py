"""The README's Python programs run as written: a newcomer who copies one gets a synthesized app, not a traceback.

Each block runs in its own interpreter (as a user's `app.py` would), with a fake account and Region for the quick
start's concrete environment; the assertions read the templates it wrote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> dict[str, str]:
    text = README.read_text()
    blocks: dict[str, str] = {}
    for heading, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", body, re.S)):
            blocks[f"{heading} #{i + 1}"] = code
    return blocks


BLOCKS = _python_blocks()


def _run(code: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, object]]]:
    program = tmp_path / "app.py"
    program.write_text(code)
    out = tmp_path / "cdk.out"
    env = {**os.environ, "CDK_OUTDIR": str(out), "CDK_DEFAULT_ACCOUNT": "111122223333",
           "CDK_DEFAULT_REGION": "us-east-1", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    result = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    templates = {p.name.removesuffix(".template.json"): json.loads(p.read_text())
                 for p in out.glob("*.template.json")}
    return result, templates


def _types(template: dict[str, object]) -> set[str]:
    resources = template.get("Resources", {})
    assert isinstance(resources, dict)
    return {str(r["Type"]) for r in resources.values()}


def test_the_readme_has_the_programs_this_test_runs() -> None:
    assert {"Quick start for your CDK app #1", "RAG: raw documents in, answers out #1"} <= set(BLOCKS)


def test_the_quick_start_synthesizes_a_chat_and_an_embedding_fleet_and_prints_the_plan(tmp_path: Path) -> None:
    result, templates = _run(BLOCKS["Quick start for your CDK app #1"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (template,) = templates.values()
    assert {"AWS::AutoScaling::AutoScalingGroup", "AWS::ElasticLoadBalancingV2::LoadBalancer",
            "AWS::SQS::Queue"} <= _types(template)
    assert "instance(s)" in result.stderr  # the plan's reasons, printed as the README says


@pytest.mark.parametrize("name", ["RAG: raw documents in, answers out #1"])
def test_the_rag_program_synthesizes_every_tier(name: str, tmp_path: Path) -> None:
    result, templates = _run(BLOCKS[name], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    types = _types(templates["Rag"])
    assert {"AWS::RDS::DBCluster", "AWS::SecretsManager::RotationSchedule", "AWS::S3::Bucket",
            "AWS::ElasticLoadBalancingV2::Listener"} <= types
    resources: dict[str, dict[str, str]] = templates["Rag"]["Resources"]  # type: ignore[assignment]
    groups = [k for k, r in resources.items() if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    assert {g[:4] for g in groups} >= {"Embe", "Prep", "Chat", "Answ"}
