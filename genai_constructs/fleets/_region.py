"""The stack's region, as the fleets use it: plan and price there, refuse types it does not offer.

A stack with a concrete ``env`` (``Environment(region="eu-west-1")``) synthesizes with its region as a literal; an
environment-agnostic stack carries the ``AWS::Region`` pseudo parameter, resolved only at deploy time ("Environments
for the AWS CDK", AWS CDK v2 developer guide). Where the region is concrete the fleets plan in it, so prices are the
region's and a type the region does not offer is refused before synthesis, naming the regions that have it (EC2
would otherwise fail the launch at deploy time: "The requested instance type is not supported in your requested
Availability Zone"). Where it is not, the plan's prices are us-east-1's and the construct says so as a warning.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Annotations, Stack, Token
from constructs import Construct

from genai_constructs.planner.pricing import is_offered, known_regions, regions_offering

AGNOSTIC_WARNING_ID = "genai-constructs:prices-are-us-east-1"
"""Acknowledge with ``Annotations.of(fleet).acknowledge_warning(AGNOSTIC_WARNING_ID)`` once the stack has an env."""
PLAN_REGION_WARNING_ID = "genai-constructs:plan-region-differs"
QUOTA_WARNING_ID = "genai-constructs:quota-beyond-likely-grant"


def warn_about_quota(scope: Construct, *, quota_warning: str | None) -> None:
    """A fleet whose maximum needs more vCPUs than an account is likely to be granted says so at synth time."""
    if quota_warning:
        Annotations.of(scope).add_warning_v2(QUOTA_WARNING_ID, quota_warning)


def stack_region(scope: Construct) -> str | None:
    """The region the stack deploys to, or None in an environment-agnostic stack (or a region no source lists)."""
    region = Stack.of(scope).region
    if Token.is_unresolved(region):
        return None
    return region if region in known_regions() else None


def region_problems(scope: Construct, *, instance_types: Sequence[str]) -> list[str]:
    """One sentence per instance type the stack's concrete region does not offer; [] when agnostic."""
    region = Stack.of(scope).region
    if Token.is_unresolved(region) or region not in known_regions():
        return []
    problems = []
    for instance_type in dict.fromkeys(instance_types):
        if not is_offered(instance_type, region):
            where = regions_offering(instance_type)
            problems.append(
                f"instance_type {instance_type!r} is not offered in the stack's region {region}; regions that offer "
                f"it: {', '.join(where) or 'none'}. Deploy the stack there (env=Environment(region=...)) or plan "
                f"another type (plan_*(..., region={region!r}) picks among the types {region} offers)"
            )
    return problems


def warn_about_prices(scope: Construct, *, plan_region: str | None) -> None:
    """Say where the plan's prices come from when they are not the stack's region's."""
    region = Stack.of(scope).region
    if Token.is_unresolved(region):
        Annotations.of(scope).add_warning_v2(
            AGNOSTIC_WARNING_ID,
            "The stack is environment-agnostic, so the plan's prices are "
            + (f"{plan_region}'s" if plan_region else "us-east-1's")
            + " and no region could check that the instance types are offered where it deploys: give the stack "
            "env=Environment(account=..., region=...) to plan, price and check in that region.",
        )
    elif plan_region != region:
        Annotations.of(scope).add_warning_v2(
            PLAN_REGION_WARNING_ID,
            f"The plan was priced for {plan_region or 'us-east-1 (no region given)'} but the stack deploys to "
            f"{region}: re-plan with region={region!r} (--region {region}) for its prices.",
        )
