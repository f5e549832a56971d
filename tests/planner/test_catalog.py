import csv
from pathlib import Path

import pytest

from genai_constructs.errors import UnknownInstanceTypeError
from genai_constructs.planner import load_catalog

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "ec2_accelerators.csv"


def test_catalog_holds_every_size_of_the_reference_data():
    if not REFERENCE.exists():
        pytest.skip("shared/reference is not beside this checkout")
    with REFERENCE.open() as f:
        names = {row["instance_type"] for row in csv.DictReader(f)}
    assert names == set(load_catalog().instances)


def test_instance_figures_come_from_the_data_file():
    g5 = load_catalog().instance("g5.12xlarge")
    assert (g5.accelerator.name, g5.accelerator_count, g5.accelerator_memory_gib) == ("A10G", 4, 22.35)
    assert g5.accelerator.memory_bandwidth_gb_s == 600
    assert g5.on_demand_usd_per_hour == pytest.approx(5.672)


def test_every_table_names_its_source():
    catalog = load_catalog()
    assert {"accelerators", "instances", "llm_benchmarks", "embedding_benchmarks"} <= set(catalog.sources)
    assert all(source.strip() for source in catalog.sources.values())
    assert catalog.price_date == "2026-07-20"


def test_p5e_has_no_public_price():
    assert load_catalog().instance("p5e.48xlarge").on_demand_usd_per_hour is None


def test_neuron_instances_are_marked():
    catalog = load_catalog()
    assert catalog.instance("inf2.xlarge").is_neuron and catalog.instance("trn1.32xlarge").is_neuron
    assert not catalog.instance("g6.xlarge").is_neuron


def test_fails_unknown_instance_type_lists_closest_names():
    with pytest.raises(
        UnknownInstanceTypeError, match=r"'g5.2xlarg' is not in the accelerator catalog \(closest: g5.2xlarge"
    ):
        load_catalog().instance("g5.2xlarg")


def test_instance_lookup_ignores_case_and_spaces():
    assert load_catalog().instance(" G5.XLARGE ").instance_type == "g5.xlarge"


def test_planning_never_imports_the_cdk():
    import subprocess
    import sys

    code = (
        "import sys, genai_constructs; from genai_constructs.planner import plan_inference; "
        "from genai_constructs.cli import main; assert 'aws_cdk' not in sys.modules, 'aws_cdk imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
