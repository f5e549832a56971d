"""Copy the regional price and availability tables of ``../shared/reference`` into the package.

Reads ``ec2_accelerator_regional_prices.csv`` and ``ec2_accelerator_regions.csv`` from ``../shared/reference``
(relative to the repository root) and writes ``genai_constructs/data/regional_prices.json``. The package reads only
the JSON: shared/ is not shipped.

Every figure is copied as the source writes it: a CSV cell ``0.519000`` becomes the JSON number ``0.519000`` (the
text is written, not a re-formatted float), a blank cell becomes ``null``. The output depends on the CSV text only
(rows sorted by instance type, then region), so running the script twice gives the same bytes; a test checks the
committed JSON against it.

Usage: ``python scripts/import_regional_prices.py [--check]``
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT.parent / "shared" / "reference"
OUTPUT_PATH = REPO_ROOT / "genai_constructs" / "data" / "regional_prices.json"
PRICES_CSV = "ec2_accelerator_regional_prices.csv"
REGIONS_CSV = "ec2_accelerator_regions.csv"

PRICE_COLUMNS = ["on_demand_usd_per_hour", "spot_usd_per_hour_min", "spot_usd_per_hour_median", "availability_zones"]
AVAILABILITY_COLUMNS = ["in_skypilot_catalog", "in_cfn_lint"]

# A JSON number (RFC 8259); a CSV cell that is not one is refused rather than quoted.
_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")

SKYPILOT_SOURCE = (
    "SkyPilot catalog, skypilot-org/skypilot-catalog, catalogs/v8/aws/vms.csv "
    "@00148f2af3672e2229b4f7bf8157d5a3f36e3c35"
)

HEADER: dict[str, object] = {
    "about": (
        "Regional prices and availability of the accelerated EC2 families the planner knows (g4dn, g5, g6, g6e, "
        "p4d, p4de, p5, p5e, p5en, p6-b200, inf2, trn1; 44 types). Copied by scripts/import_regional_prices.py "
        "from shared/reference/ec2_accelerator_regional_prices.csv and ec2_accelerator_regions.csv; read by "
        "genai_constructs.planner.pricing. Do not edit by hand: edit the CSVs and run the script."
    ),
    "sources": {
        "prices": {
            "source": SKYPILOT_SOURCE,
            "repository": "skypilot-org/skypilot-catalog",
            "path": "catalogs/v8/aws/vms.csv",
            "commit": "00148f2af3672e2229b4f7bf8157d5a3f36e3c35",
            "short_commit": "00148f2",
            "date": None,
            "date_note": (
                "Neither the file nor the index gives the commit's date; SkyPilot's README says the catalog is "
                "fetched from AWS and refreshed every 7 hours. The spot figures are a snapshot of unknown date."
            ),
            "method": (
                "Aggregated from the catalog's 1,443 per-AZ rows into 551 (instance type, region) rows over 24 "
                "regions. on_demand_usd_per_hour is the Price column, identical in every AZ of a region for all "
                "551 rows. spot_usd_per_hour_min and spot_usd_per_hour_median are over the AZs that carry a "
                "SpotPrice, the median being the lower middle value when the count is even, so every figure is one "
                "the source prints and none is averaged. availability_zones counts the zone IDs listed, local "
                "zones included (use1-atl2-az1 for p5.48xlarge, p5en.48xlarge, p6-b200.48xlarge; usw2-lax1-az1/az2 "
                "for g4dn and g5.4xlarge/g5.8xlarge)."
            ),
            "licence": (
                "The catalog repository's stored copy carries no licence file (SkyPilot itself is Apache-2.0); "
                "prices are facts, cited as the source above."
            ),
        },
        "availability": {
            "source": (
                "Every (type, region) pair found in either source: the SkyPilot catalog above, and cfn-lint 1.58.0 "
                "data file aws_ec2_instance/instancetype_enum.json (schema date 2026-10-20T22:11:15Z; the file says "
                "'Automatically updated using update_specs_from_pricing', i.e. it is built from AWS price lists; its "
                "empty 'all' key is not a region)"
            ),
            "cfn_lint_version": "1.58.0",
            "cfn_lint_file": "aws_ec2_instance/instancetype_enum.json",
            "cfn_lint_schema_date": "2026-10-20T22:11:15Z",
            "licence": "cfn-lint is MIT-0.",
        },
    },
    "caveats": [
        "Spot figures are a snapshot of unknown date (see sources.prices.date_note): an estimate, not a quote.",
        "p5e.48xlarge has no on-demand price in any region (capacity blocks only); trn1.32xlarge has none in "
        "ap-south-1, ap-southeast-2 and ap-southeast-4 (listed with no price at all).",
        "Spot is blank for those rows and for p5.48xlarge in ap-northeast-2, p5.4xlarge in ap-southeast-2, "
        "us-east-1, us-east-2, us-west-2, and p5en.48xlarge in me-central-1.",
        "The source writes p4d.24xlarge as 21.957642 in us-east-1 but 21.95764 in us-east-2 and us-west-2; both "
        "kept as written.",
        "Nine regions are known from cfn-lint only, with no price here: sa-east-1, us-gov-west-1, ap-south-2, "
        "cn-northwest-1, cn-north-1, us-gov-east-1, il-central-1, eu-central-2, ap-southeast-5. Inside the 24 "
        "priced regions cfn-lint alone lists g6e in ap-northeast-3, ap-south-1 and me-central-1, g5 in eu-south-2 "
        "and eu-west-3, p6-b200.48xlarge in ap-south-1, eu-north-1 and eu-west-3, p5.4xlarge in eu-north-1, "
        "p4d.24xlarge in ap-southeast-1.",
        "The SkyPilot catalog alone lists p5e.48xlarge in ap-southeast-2, ap-southeast-3, eu-north-1, eu-west-2, "
        "us-west-2 and trn1.32xlarge in ap-south-1, ap-southeast-2, ap-southeast-4: all rows with no on-demand "
        "price, which a price-list-derived list leaves out.",
        "A cfn-lint entry means the type is priced in that region, not that capacity is free; the SkyPilot rows "
        "are what its fetcher saw per AZ.",
        "us-east-1 on-demand agrees with the catalog (genai_constructs/data/catalog.json) for every type, equal or "
        "the same figure rounded there (g6.xlarge 0.8048 vs 0.805, p4d.24xlarge 21.957642 vs 21.958, "
        "p6-b200.48xlarge 113.9328 vs 113.93).",
    ],
}


def _number(cell: str, *, where: str) -> str:
    """The cell's text as a JSON number token, ``null`` when blank."""
    text = cell.strip()
    if not text:
        return "null"
    if not _JSON_NUMBER.fullmatch(text):
        raise ValueError(f"{where}: {cell!r} is not a number")
    return text


def _yes_no(cell: str, *, where: str) -> str:
    text = cell.strip().lower()
    if text not in ("yes", "no"):
        raise ValueError(f"{where}: {cell!r} is neither yes nor no")
    return "true" if text == "yes" else "false"


def _read(path: Path, columns: list[str]) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        expected = ["instance_type", "region", *columns]
        if reader.fieldnames != expected:
            raise ValueError(f"{path.name}: columns {reader.fieldnames} are not {expected}")
        return list(reader)


def _nested(rows: list[tuple[str, str, str]], indent: str) -> str:
    """``{"type": {"region": <row>, ...}, ...}`` with one (type, region) per line; rows already sorted."""
    out = io.StringIO()
    out.write("{")
    current: str | None = None
    for instance_type, region, row in rows:
        if instance_type != current:
            if current is not None:
                out.write(f"\n{indent}  }},")
            out.write(f"\n{indent}  {json.dumps(instance_type)}: {{")
            current = instance_type
            first = True
        out.write(("" if first else ",") + f"\n{indent}    {json.dumps(region)}: {row}")
        first = False
    if current is not None:
        out.write(f"\n{indent}  }}")
    out.write(f"\n{indent}}}")
    return out.getvalue()


def render(reference_dir: Path = REFERENCE_DIR) -> str:
    """The JSON text for ``reference_dir``'s two CSVs."""
    price_rows = _read(reference_dir / PRICES_CSV, PRICE_COLUMNS)
    availability_rows = _read(reference_dir / REGIONS_CSV, AVAILABILITY_COLUMNS)

    prices: list[tuple[str, str, str]] = []
    for n, row in enumerate(price_rows, start=2):
        where = f"{PRICES_CSV} line {n}"
        cells = [_number(row[c], where=where) for c in PRICE_COLUMNS]
        prices.append((row["instance_type"].strip(), row["region"].strip(), "[" + ", ".join(cells) + "]"))
    availability: list[tuple[str, str, str]] = []
    for n, row in enumerate(availability_rows, start=2):
        where = f"{REGIONS_CSV} line {n}"
        cells = [_yes_no(row[c], where=where) for c in AVAILABILITY_COLUMNS]
        availability.append((row["instance_type"].strip(), row["region"].strip(), "[" + ", ".join(cells) + "]"))
    for name, rows in ((PRICES_CSV, prices), (REGIONS_CSV, availability)):
        keys = [(t, r) for t, r, _ in rows]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{name}: a (instance type, region) pair appears twice")
        rows.sort(key=lambda item: (item[0], item[1]))

    header = json.dumps(HEADER, indent=2, ensure_ascii=False)
    return (
        header[:-2]
        + ',\n  "prices": {\n'
        + f'    "columns": {json.dumps(PRICE_COLUMNS)},\n'
        + f'    "rows": {_nested(prices, "    ")}\n'
        + "  },\n"
        + '  "availability": {\n'
        + f'    "columns": {json.dumps(AVAILABILITY_COLUMNS)},\n'
        + f'    "rows": {_nested(availability, "    ")}\n'
        + "  }\n}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs; write nothing")
    args = parser.parse_args(argv)
    text = render()
    json.loads(text)  # refuse to write anything that is not JSON
    if args.check:
        same = OUTPUT_PATH.exists() and OUTPUT_PATH.read_text(encoding="utf-8") == text
        print(f"{OUTPUT_PATH}: {'up to date' if same else 'differs from the CSVs; run the script'}")
        return 0 if same else 1
    OUTPUT_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
