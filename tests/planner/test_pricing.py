"""Money and capacity: regional prices, fleet and batch bills, vCPU quotas.

Expected figures are written from the reference CSVs (shared/reference) and the AWS pricing pages by hand, never
computed by the code under test.
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from genai_constructs.errors import (
    GenaiConstructsError,
    InstanceTypeNotOfferedError,
    PriceUnknownError,
    UnknownInstanceTypeError,
    UnknownRegionError,
)
from genai_constructs.planner import deployment, pricing

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "genai_constructs" / "data"
REFERENCE = REPO.parent / "shared" / "reference"

# Lines copied from shared/reference/ec2_accelerator_regional_prices.csv.
PRICE_CSV_LINES = """instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour_min,spot_usd_per_hour_median,availability_zones
g5.xlarge,us-east-1,1.006,0.424600,0.436000,5
g5.2xlarge,us-east-1,1.212,0.473800,0.503600,5
g5.2xlarge,eu-west-1,1.35296,0.617900,0.618500,3
g4dn.12xlarge,af-south-1,5.19,0.519000,0.519000,2
p5e.48xlarge,us-east-2,,18.735900,18.735900,3
p5e.48xlarge,ap-southeast-2,,,,1
"""

# gp3, us-east-1 (Amazon EBS pricing): $0.08/GiB-month, $0.005/IOPS-month over 3,000, $0.04/MiB/s-month over 125;
# 730 h a month. The inference root for 15 GiB of weights: ceil((100 + 40 + 15) x 1.2) = 186 GiB at 4000 IOPS and
# 1000 MiB/s: 186 x 0.08 + 1000 x 0.005 + 875 x 0.04 = 14.88 + 5 + 35 = 54.88 USD a month.
INFERENCE_ROOT_15_GIB_USD_PER_MONTH = 54.88


def fleet(region: str | None = "us-east-1", **overrides: object) -> pricing.FleetCost:
    """A llama-3.1-8b-like fleet: g5.2xlarge, 2 running / 6 max, 15 GiB of weights, running below capacity."""
    kwargs: dict[str, object] = dict(
        region=region, running_instances=2, max_instances=6, weights_gib=15, output_tokens_per_s_at_traffic=600,
        output_tokens_per_s_per_instance_at_capacity=700, concurrent_sessions=20)
    kwargs.update(overrides)
    return pricing.inference_fleet_cost("g5.2xlarge", **kwargs)  # type: ignore[arg-type]


def item(cost: pricing.FleetCost, name_start: str) -> pricing.CostItem:
    (found,) = [i for i in cost.items if i.name.startswith(name_start)]
    return found


# ---------------------------------------------------------------------------------------------- regional data file

def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_regional_prices", REPO / "scripts" / "import_regional_prices.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regional_json_copies_the_csv_figures_as_written() -> None:
    text = (DATA / "regional_prices.json").read_text()
    rows = json.loads(text)["prices"]["rows"]
    for line in csv.DictReader(io.StringIO(PRICE_CSV_LINES)):
        expected = [None if line[c] == "" else float(line[c]) for c in
                    ("on_demand_usd_per_hour", "spot_usd_per_hour_min", "spot_usd_per_hour_median")]
        assert rows[line["instance_type"]][line["region"]] == [*expected, int(line["availability_zones"])]
    # The number text itself is the source's: 0.519000, not 0.519.
    assert '"af-south-1": [5.19, 0.519000, 0.519000, 2]' in text


def test_regional_json_carries_sources_and_caveats() -> None:
    raw = json.loads((DATA / "regional_prices.json").read_text())
    prices = raw["sources"]["prices"]
    assert prices["commit"] == "00148f2af3672e2229b4f7bf8157d5a3f36e3c35"
    assert prices["date"] is None and "unknown date" in prices["date_note"]
    assert raw["sources"]["availability"]["cfn_lint_schema_date"] == "2026-10-20T22:11:15Z"
    caveats = " ".join(raw["caveats"])
    assert "p5e.48xlarge has no on-demand price" in caveats and "cfn-lint only" in caveats
    assert sum(len(v) for v in raw["prices"]["rows"].values()) == 551
    assert sum(len(v) for v in raw["availability"]["rows"].values()) == 734
    assert raw["availability"]["rows"]["p5e.48xlarge"]["us-west-2"] == [True, False]


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/reference is not present")
def test_regional_json_is_what_the_import_script_writes() -> None:
    assert (DATA / "regional_prices.json").read_text() == load_script().render(REFERENCE)


def test_network_prices_are_the_us_east_1_figures() -> None:
    raw = json.loads((DATA / "network_prices.json").read_text())
    assert raw["application_load_balancer"]["usd_per_hour"]["value"] == 0.0225
    assert raw["application_load_balancer"]["usd_per_lcu_hour"]["value"] == 0.008
    assert raw["interface_endpoint"]["usd_per_endpoint_az_hour"]["value"] == 0.01
    assert raw["interface_endpoint"]["usd_per_gb_processed"]["value"] == 0.01
    assert raw["s3_gateway_endpoint"]["usd_per_hour"]["value"] == 0
    assert raw["nat_gateway"]["used"] is False
    assert "us-east-1, used for every region" in raw["region_note"]


# ------------------------------------------------------------------------------------------- regions and prices

def test_regions() -> None:
    regions = pricing.known_regions()
    assert len(regions) == 33 and "eu-west-1" in regions and "sa-east-1" in regions
    assert pricing.regions_offering("p5e.48xlarge") == [
        "ap-southeast-2", "ap-southeast-3", "eu-north-1", "eu-west-2", "us-east-2", "us-west-2"]
    assert pricing.is_offered("g6e.xlarge", "ap-south-1")  # cfn-lint only
    assert not pricing.is_offered("g6e.xlarge", "eu-west-1")


def test_instance_price_in_us_east_1_and_eu_west_1() -> None:
    us = pricing.instance_price("g5.xlarge", "us-east-1")
    assert (us.on_demand_usd_per_hour, us.spot_usd_per_hour, us.spot_usd_per_hour_min) == (1.006, 0.436, 0.4246)
    assert us.on_demand_label == "on-demand, us-east-1, SkyPilot catalog @00148f2"
    assert "median over up to 5 AZs" in us.spot_label and "unknown date" in us.spot_label
    eu = pricing.instance_price("g5.2xlarge", "eu-west-1")
    assert eu.on_demand_usd_per_hour == 1.35296
    assert eu.on_demand_usd_per_hour != pricing.instance_price("g5.2xlarge", "us-east-1").on_demand_usd_per_hour


def test_no_region_falls_back_to_the_catalog_us_east_1_price() -> None:
    price = pricing.instance_price("G5.2XLARGE", None)
    assert price.on_demand_usd_per_hour == 1.212 and price.region is None
    assert "no region given" in price.on_demand_label


def test_p5e_has_no_on_demand_price() -> None:
    assert pricing.instance_price("p5e.48xlarge", None).on_demand_usd_per_hour is None
    in_ohio = pricing.instance_price("p5e.48xlarge", "us-east-2")
    assert in_ohio.on_demand_usd_per_hour is None and in_ohio.spot_usd_per_hour == 18.7359
    with pytest.raises(PriceUnknownError, match="no on-demand price"):
        pricing.inference_fleet_cost(
            "p5e.48xlarge", region="us-east-2", running_instances=2, max_instances=3, weights_gib=131,
            output_tokens_per_s_at_traffic=100, output_tokens_per_s_per_instance_at_capacity=1000,
            concurrent_sessions=10)


def test_unknown_region_names_the_closest() -> None:
    with pytest.raises(UnknownRegionError, match="eu-west-1"):
        pricing.instance_price("g5.xlarge", "eu-west-9")
    with pytest.raises(UnknownInstanceTypeError, match="g5.xlarge"):
        pricing.regions_offering("g5.xlarg")


def test_type_not_offered_lists_the_regions_that_have_it() -> None:
    with pytest.raises(InstanceTypeNotOfferedError) as error:
        pricing.instance_price("p5e.48xlarge", "us-east-1")
    assert "ap-southeast-2, ap-southeast-3, eu-north-1, eu-west-2, us-east-2, us-west-2" in str(error.value)
    with pytest.raises(InstanceTypeNotOfferedError, match="similar types offered there: g5"):
        pricing.instance_price("g6e.xlarge", "eu-west-1")


def test_type_not_offered_names_the_family_sizes_offered_there() -> None:
    # ec2_accelerator_regions.csv lists p5.48xlarge in ca-central-1 but no p5.4xlarge there.
    with pytest.raises(InstanceTypeNotOfferedError, match="p5 sizes offered in ca-central-1: p5.48xlarge"):
        pricing.instance_price("p5.4xlarge", "ca-central-1")
    with pytest.raises(InstanceTypeNotOfferedError, match="no p5e size is offered in us-east-1"):
        pricing.instance_price("p5e.48xlarge", "us-east-1")


# ---------------------------------------------------------------------------------------------------- fleet cost

def test_warm_pool_of_a_2_min_6_max_fleet_is_four_stopped_root_volumes() -> None:
    cost = fleet()
    assert cost.root_volume_gib == 186 and cost.warm_pool_instances == 4
    assert item(cost, "warm pool").usd_per_hour == pytest.approx(4 * INFERENCE_ROOT_15_GIB_USD_PER_MONTH / 730)
    assert item(cost, "root volumes of running").usd_per_hour == pytest.approx(2 * INFERENCE_ROOT_15_GIB_USD_PER_MONTH / 730)
    assert "Warm pools" in item(cost, "warm pool").basis


def test_fleet_bill_line_by_line_in_us_east_1() -> None:
    cost = fleet()
    assert item(cost, "instances running").usd_per_hour == pytest.approx(2 * 1.212)
    assert item(cost, "application load balancer (hourly)").usd_per_hour == pytest.approx(0.0225)
    # 600 tokens/s stream about 0.48 GB/h through the ALB: under one LCU, so the one-LCU floor.
    assert item(cost, "application load balancer (LCUs)").usd_per_hour == pytest.approx(0.008)
    assert item(cost, "interface VPC endpoints (hourly)").usd_per_hour == pytest.approx(11 * 2 * 0.01)
    expected_total = 2.424 + 6 * INFERENCE_ROOT_15_GIB_USD_PER_MONTH / 730 + 0.0225 + 0.008 + 0.22 + 2 * 0.01 * 0.01
    assert cost.usd_per_hour == pytest.approx(expected_total)
    assert cost.usd_per_hour == pytest.approx(sum(i.usd_per_hour for i in cost.items))


def test_eu_west_1_fleet_costs_more_than_us_east_1() -> None:
    assert item(fleet("eu-west-1"), "instances running").usd_per_hour == pytest.approx(2 * 1.35296)
    assert fleet("eu-west-1").usd_per_hour > fleet("us-east-1").usd_per_hour
    assert any("us-east-1 figures, used for every region" in note for note in fleet("eu-west-1").notes)


def test_cost_per_million_tokens_at_traffic_exceeds_at_capacity_below_capacity() -> None:
    cost = fleet()
    # 1.212 USD/h over 700 tokens/s x 3600 s = 0.48095 USD per million output tokens.
    assert cost.usd_per_million_output_tokens_at_capacity == pytest.approx(1.212 / 2.52)
    assert cost.usd_per_million_output_tokens_at_traffic is not None
    assert cost.usd_per_million_output_tokens_at_traffic > cost.usd_per_million_output_tokens_at_capacity
    assert "instances only" in cost.usd_per_million_output_tokens_at_capacity_label


def test_alb_lcus_follow_the_largest_dimension() -> None:
    # 5,000 sessions x 2 connections / 3,000 per LCU = 3.33 LCU.
    lcus, reason = pricing.alb_lcus(requests_per_s=10, concurrent_sessions=5000, processed_gb_per_hour=0.5)
    assert lcus == pytest.approx(10000 / 3000) and reason.startswith("active connections")


def test_spot_uses_the_regional_median_and_refuses_a_warm_pool() -> None:
    cost = fleet(spot=True, warm_pool=False)
    assert item(cost, "instances running").usd_per_hour == pytest.approx(2 * 0.5036)
    assert cost.warm_pool_instances == 0 and not [i for i in cost.items if i.name.startswith("warm pool")]
    assert any("Spot estimate" in note for note in cost.notes)
    with pytest.raises(GenaiConstructsError, match="warm pool cannot be added"):
        fleet(spot=True)


def test_fleet_inputs_are_checked() -> None:
    with pytest.raises(GenaiConstructsError, match="max_instances"):
        fleet(max_instances=1)
    with pytest.raises(GenaiConstructsError, match="output_tokens_per_s_per_instance_at_capacity"):
        fleet(output_tokens_per_s_per_instance_at_capacity=0)


# ------------------------------------------------------------------------------------------------------ batch job

def test_batch_job_includes_start_up_and_endpoint_hours() -> None:
    # 1e9 tokens over 4 x g6.xlarge at 20,000 tokens/s each: 12,500 s = 3.4722 h of work, plus 600 s start-up.
    cost = pricing.batch_job_cost("g6.xlarge", region="us-east-1", instances=4, total_tokens=1e9,
                                  tokens_per_s_per_instance=20000, startup_s=600, weights_gib=1)
    hours = (12500 + 600) / 3600
    assert cost.hours_wall_clock == pytest.approx(hours)
    by_name = {i.name: i.usd for i in cost.items}
    assert by_name["instances"] == pytest.approx(4 * hours * 0.8048)
    # Root: ceil((100 + 40 + 1) x 1.2) = 170 GiB at the gp3 baseline: 170 x 0.08 = 13.6 USD a month.
    assert cost.root_volume_gib == 170
    assert by_name["root volumes"] == pytest.approx(4 * hours * 13.6 / 730)
    # 3.64 h is billed as 4 endpoint-hours: 11 endpoints x 2 AZs x 4 h x 0.01.
    assert by_name["interface VPC endpoints (hourly)"] == pytest.approx(0.88)
    assert cost.usd_per_million_tokens == pytest.approx(cost.total_usd / 1000)


# ---------------------------------------------------------------------------------------------------------- quota

def test_vcpu_quota_names_the_family_group() -> None:
    need = pricing.vcpu_quota("g5.2xlarge", 6)
    assert (need.quota_name, need.vcpus, need.warning) == ("Running On-Demand G and VT instances", 48, None)
    assert need.increase_needed_on_new_account
    assert pricing.vcpu_quota("p5.48xlarge", 2, spot=True).quota_name == "All P Spot Instance Requests"
    assert pricing.vcpu_quota("inf2.xlarge", 1).quota_name == "Running On-Demand Inf instances"
    assert pricing.vcpu_quota("trn1.2xlarge", 1).quota_name == "Running On-Demand Trn instances"


def test_vcpu_quota_warns_above_the_largest_likely_grant() -> None:
    need = pricing.vcpu_quota("p5.48xlarge", 24)  # 24 x 192 = 4,608 vCPUs
    assert need.vcpus == 4608 and need.warning is not None and "our judgement" in need.warning
    assert pricing.vcpu_quota("p5.48xlarge", 20).warning is None  # 3,840 vCPUs


# ------------------------------------------------------------------------------------------ deployment facts

def _literals(path: Path) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` assignments of a source file, read without importing it (aws_cdk)."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)  # type: ignore[arg-type]
            except ValueError:
                pass
    return found


def test_deployment_facts_match_the_constructs() -> None:
    assert deployment.root_volume_gib(15) == 186
    launch = _literals(REPO / "genai_constructs" / "fleets" / "_launch.py")
    inference = _literals(REPO / "genai_constructs" / "fleets" / "inference.py")
    network = _literals(REPO / "genai_constructs" / "network" / "private_data_path.py")
    # Until the constructs import these from planner.deployment, their own literals must agree.
    for name in ("DLAMI_ROOT_GIB", "CONTAINER_IMAGE_GIB", "ROOT_VOLUME_HEADROOM"):
        if name in launch:
            assert launch[name] == getattr(deployment, name)
    if "ROOT_VOLUME_IOPS" in inference:
        assert inference["ROOT_VOLUME_IOPS"] == deployment.INFERENCE_ROOT_VOLUME_IOPS == 4000
        assert inference["ROOT_VOLUME_THROUGHPUT_MIBPS"] == deployment.INFERENCE_ROOT_VOLUME_THROUGHPUT_MIBPS == 1000
    for name in ("WARM_POOL_MIN_SIZE", "SCALE_OUT_ROOM"):
        if name in inference:
            assert inference[name] == getattr(deployment, name) == 1
    if "DEFAULT_INTERFACE_ENDPOINTS" in network:
        assert network["DEFAULT_INTERFACE_ENDPOINTS"] == deployment.DEFAULT_INTERFACE_ENDPOINTS
        assert list(network["DEFAULT_INTERFACE_ENDPOINTS"]) == list(deployment.DEFAULT_INTERFACE_ENDPOINTS)  # type: ignore[call-overload]
    if "DEFAULT_MAX_AZS" in network:
        assert network["DEFAULT_MAX_AZS"] == deployment.DEFAULT_AVAILABILITY_ZONES == 2


def test_pricing_does_not_import_aws_cdk() -> None:
    code = "import sys, genai_constructs.planner.pricing; sys.exit('aws_cdk' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0
