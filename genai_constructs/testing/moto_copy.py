"""The copy of a cloud assembly that moto deploys, and what differs from the real one (docs/local-deploy.md).

Custom resources are left out, reserved SSM parameters (DLAMI AMI ids) become plain strings, certificate ARNs point
at a certificate in moto, and references moto cannot resolve become placeholders. Verifiers read the real templates.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genai_constructs.testing.emulator import MotoServer, is_custom_resource, moto_creates, moto_resolves

LOCAL_ASSETS_BUCKET = "genai-constructs-local-assets"
"""Bucket in moto the CDK CLI publishes file assets (custom resource Lambda code) to; created before each deploy."""


def references(value: Any) -> set[str]:
    """Logical ids a template fragment points at through Ref, Fn::GetAtt or Fn::Sub."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, arg in value.items():
            if key == "Ref" and isinstance(arg, str):
                found.add(arg)
            elif key == "Fn::GetAtt":
                found.add(arg[0] if isinstance(arg, list) else str(arg).split(".", 1)[0])
            elif key == "Fn::Sub":
                text = arg[0] if isinstance(arg, list) else arg
                found.update(name.split(".", 1)[0] for name in re.findall(r"\$\{([^}!]+)\}", str(text)))
            found |= references(arg)
    elif isinstance(value, list):
        for item in value:
            found |= references(item)
    return found


def strip_custom_resources(template: dict[str, Any]) -> list[tuple[str, str]]:
    """Remove custom resources (and what refers to them) from ``template`` in place; return (logical id, type).

    moto accepts them but never finishes creating them without Docker, so the stack would wait forever;
    they stay in the real template and are reported as template-only.
    """
    resources = template.get("Resources", {})
    removed = {k for k, v in resources.items() if is_custom_resource(str(v.get("Type")))}
    changed = True
    while changed:
        changed = False
        for logical, resource in list(resources.items()):
            if logical in removed:
                continue
            body = {k: v for k, v in resource.items() if k != "DependsOn"}
            if references(body) & removed:
                removed.add(logical)
                changed = True
    result = [(logical, str(resources[logical]["Type"])) for logical in sorted(removed)]
    for logical in removed:
        del resources[logical]
    for resource in resources.values():
        depends = resource.get("DependsOn")
        if isinstance(depends, str) and depends in removed:
            del resource["DependsOn"]
        elif isinstance(depends, list):
            kept = [d for d in depends if d not in removed]
            if kept:
                resource["DependsOn"] = kept
            else:
                del resource["DependsOn"]
    outputs = template.get("Outputs", {})
    for name in [n for n, o in outputs.items() if references(o) & removed]:
        del outputs[name]
    return result


def single_forward_listeners(template: dict[str, Any]) -> int:
    """Turn weighted forward actions (``ForwardConfig`` with target groups and weights) into a plain forward to the
    heaviest target group, in place; return how many changed. moto's CloudFormation parser reads only
    ``TargetGroupArn`` from a forward action; the rollout state machine sets the weights through ModifyListener,
    which moto does support (tests/runtime/test_rollout.py)."""
    changed = 0
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") not in ("AWS::ElasticLoadBalancingV2::Listener",
                                        "AWS::ElasticLoadBalancingV2::ListenerRule"):
            continue
        properties = resource.get("Properties", {})
        for key in ("DefaultActions", "Actions"):
            for action in properties.get(key, []):
                groups = (action.get("ForwardConfig") or {}).get("TargetGroups")
                if action.get("Type") == "forward" and groups and "TargetGroupArn" not in action:
                    heaviest = max(groups, key=lambda g: g.get("Weight", 1))
                    action["TargetGroupArn"] = heaviest["TargetGroupArn"]
                    del action["ForwardConfig"]
                    changed += 1
    return changed


def assembly_for_moto(
    assembly: Path, ssm_substitutes: Mapping[str, str] | None = None, replacements: Mapping[str, str] | None = None
) -> tuple[Path, dict[str, list[tuple[str, str]]]]:
    """A copy of ``assembly`` that moto can deploy: custom resources stripped, reserved SSM parameters (AMI ids)
    substituted, literal strings replaced (certificate ARNs); returns it and what was removed."""
    copy = Path(tempfile.mkdtemp(prefix="cdk-moto-assembly-")) / "cdk.out"
    shutil.copytree(assembly, copy)
    skip_docker_image_assets(copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    removed: dict[str, list[tuple[str, str]]] = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        path = copy / properties["templateFile"]
        template = json.loads(path.read_text())
        stripped = strip_custom_resources(template)
        forwarded = single_forward_listeners(template)
        substituted = substitute_ssm_parameters(template, ssm_substitutes or {})
        substituted += ["aurora instance"] * aurora_instances_for_moto(template)
        substituted += ["reference"] * substitute_unresolvedreferences(template)
        if replacements:
            template["Resources"] = _replace_strings(template.get("Resources", {}), replacements)
        if stripped or forwarded or substituted or replacements:
            path.write_text(json.dumps(template, indent=1))
        removed[properties.get("stackName", artifact_id)] = stripped
    return copy, removed


def assembly_stacks(assembly: Path) -> dict[str, dict[str, Any]]:
    """Templates of the CloudFormation stacks in a cloud assembly, by stack name."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    stacks: dict[str, dict[str, Any]] = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        name = properties.get("stackName", artifact_id)
        stacks[name] = json.loads((assembly / properties["templateFile"]).read_text())
    return stacks


def seed_ssm_parameters(server: MotoServer, templates: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """Give every SSM-typed template parameter moto lacks a value; return the ones to substitute in the templates.

    moto ships only the public Amazon Linux parameters and refuses to create others under ``/aws/`` (reserved), so
    those (the DLAMI AMI-id paths) come back as path -> value for :func:`assembly_for_moto` to put in the template;
    any other missing path is created in moto. An AMI-id parameter gets an image moto knows.
    """
    session = server.session()
    ssm = session.client("ssm")
    image_id: str | None = None
    substitutes: dict[str, str] = {}
    for template in templates.values():
        for parameter in template.get("Parameters", {}).values():
            kind = str(parameter.get("Type", ""))
            path = parameter.get("Default")
            if not kind.startswith("AWS::SSM::Parameter::Value<") or not path or path in substitutes:
                continue
            try:
                ssm.get_parameter(Name=path)
                continue
            except ssm.exceptions.ParameterNotFound:
                pass
            if "Image::Id" in kind:
                if image_id is None:
                    image_id = session.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
                value = image_id
            else:
                value = "local-placeholder"
            if str(path).startswith("/aws/"):
                substitutes[str(path)] = value
            else:
                ssm.put_parameter(Name=path, Value=value, Type="String", Overwrite=True)
    return substitutes


_ACM_ARN = re.compile(r"arn:aws:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]+")


def local_certificates(server: MotoServer, templates: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """ACM certificate ARNs the templates name, each mapped to a certificate requested in moto.

    moto's load balancer refuses a listener whose certificate it does not hold, and ACM ARNs carry a random id,
    so the deployed copy points at a moto certificate instead; the verifiers still read the real template.
    """
    arns = sorted({arn for template in templates.values() for arn in _ACM_ARN.findall(json.dumps(template))})
    if not arns:
        return {}
    acm = server.session().client("acm")
    local = acm.request_certificate(DomainName="genai-constructs.local", ValidationMethod="DNS")["CertificateArn"]
    return {arn: str(local) for arn in arns}


REF_IS_ARN: dict[str, str] = {
    "AWS::SecretsManager::Secret": "secretsmanager",
    "AWS::SecretsManager::SecretTargetAttachment": "secretsmanager",
}
"""Types moto's CloudFormation does not create whose ``Ref`` is an ARN (the secret's, for a target attachment:
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-secretsmanager-secrettargetattachment.html):
their placeholder is ARN-shaped, because the consumers' IAM policies name them and moto validates policy ARNs."""


def substitute_unresolvedreferences(template: dict[str, Any]) -> int:
    """Replace Ref/GetAtt that moto cannot resolve with placeholder strings, in place; return how many.

    A reference to a resource moto does not create (an alarm, a placement group) or to an attribute it does not
    implement (a target group's full name) fails the whole stack in moto; in the deployed copy it becomes
    ``local/<logical id>/<attribute>``. Those values feed resources moto skips or stores without using.
    """
    types = {k: str(v.get("Type")) for k, v in template.get("Resources", {}).items()}
    count = 0

    def walk(value: Any) -> Any:
        nonlocal count
        if isinstance(value, dict):
            if set(value) == {"Ref"} and value["Ref"] in types and not moto_creates(types[value["Ref"]]):
                count += 1
                service = REF_IS_ARN.get(types[value["Ref"]])
                if service is not None:  # an IAM policy naming it must still hold an ARN, or moto refuses it
                    return f"arn:aws:{service}:us-east-1:123456789012:secret:local-{value['Ref']}"
                return f"local/{value['Ref']}"
            if set(value) == {"Fn::GetAtt"}:
                arg = value["Fn::GetAtt"]
                logical, attribute = arg if isinstance(arg, list) else str(arg).split(".", 1)
                kind = types.get(logical, "")
                if not moto_creates(kind) or not moto_resolves(kind, attribute):
                    count += 1
                    return f"local/{logical}/{attribute}"
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    template["Resources"] = walk(template.get("Resources", {}))
    return count


def _replace_strings(value: Any, replacements: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return replacements.get(value, value)
    if isinstance(value, list):
        return [_replace_strings(v, replacements) for v in value]
    if isinstance(value, dict):
        return {k: _replace_strings(v, replacements) for k, v in value.items()}
    return value


def substitute_ssm_parameters(template: dict[str, Any], substitutes: Mapping[str, str]) -> list[str]:
    """Turn SSM-typed parameters whose path is in ``substitutes`` into plain strings holding the value; in place."""
    changed = []
    for name, parameter in template.get("Parameters", {}).items():
        if (
            str(parameter.get("Type", "")).startswith("AWS::SSM::Parameter::Value<")
            and parameter.get("Default") in substitutes
        ):
            parameter["Type"] = "String"
            parameter["Default"] = substitutes[parameter["Default"]]
            changed.append(name)
    return changed


def aurora_instances_for_moto(template: dict[str, Any]) -> int:
    """Give each Aurora DB instance what moto needs to create it standalone, in place; return how many.

    moto's CloudFormation creates ``AWS::RDS::DBInstance`` but not ``AWS::RDS::DBCluster`` (nor its parameter group),
    and reads no ``DBClusterIdentifier``: an Aurora instance in a template takes its engine version, subnet group and
    security groups from the cluster, and moto without them fails the stack (no default version for
    ``aurora-postgresql``). In the deployed copy each instance gets them from its cluster's properties, so moto
    creates one DB instance per template instance, in the cluster's subnet group; the verifiers read the real
    template, and check the cluster's own settings there.
    """
    resources = template.get("Resources", {})
    count = 0
    for resource in resources.values():
        if resource.get("Type") != "AWS::RDS::DBInstance":
            continue
        properties = resource.setdefault("Properties", {})
        target = properties.get("DBClusterIdentifier")
        cluster = resources.get(target.get("Ref")) if isinstance(target, dict) else None
        if cluster is None or cluster.get("Type") != "AWS::RDS::DBCluster" or moto_creates("AWS::RDS::DBCluster"):
            continue
        cluster_properties = cluster.get("Properties", {})
        del properties["DBClusterIdentifier"]
        for key, value in (("EngineVersion", cluster_properties.get("EngineVersion")),
                           ("DBSubnetGroupName", cluster_properties.get("DBSubnetGroupName")),
                           ("VPCSecurityGroups", cluster_properties.get("VpcSecurityGroupIds")),
                           ("StorageEncrypted", cluster_properties.get("StorageEncrypted")),
                           ("KmsKeyId", cluster_properties.get("KmsKeyId"))):
            if value is not None and key not in properties:
                properties[key] = value
        count += 1
    return count


def skip_docker_image_assets(copy: Path) -> int:
    """Drop the container image assets (the CPU tiers' ``DockerImageAsset``) from the copy's asset manifests; return
    how many. The local deploy has no docker daemon, so the CDK CLI could not build them; the templates keep the image
    URI (moto's launch templates never pull it), and a real deploy builds and publishes the image."""
    dropped = 0
    for manifest in copy.glob("*.assets.json"):
        data = json.loads(manifest.read_text())
        dropped += len(data.get("dockerImages", {}))
        if data.pop("dockerImages", None):
            manifest.write_text(json.dumps(data, indent=1))
    return dropped
