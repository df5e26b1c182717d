"""The package can be cited: CITATION.cff is valid CFF 1.2.0 and names the papers whose claims it tests."""

import json
import re
import sys
import zipfile
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPERS = {"2211.17192", "2302.01318", "2510.22876"}  # Leviathan et al., Chen et al., Zhang et al.


def cff_schema() -> dict:
    """The CFF 1.2.0 JSON schema from the cffconvert wheel `make setup` downloads into the venv."""
    wheels = sorted((Path(sys.prefix) / "wheels").glob("cffconvert-2.0.0-*.whl"))
    assert wheels, f"no cffconvert wheel in {Path(sys.prefix) / 'wheels'}: run `make setup`"
    with zipfile.ZipFile(wheels[0]) as wheel:
        return json.loads(wheel.read("cffconvert/schemas/1.2.0/schema.json"))


def test_citation_cff_is_valid_cff_1_2_0():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    schema = cff_schema()
    jsonschema.validate(cff, schema)
    broken = dict(cff, authors="nobody")  # the check can fail
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_citation_files_name_the_three_papers_and_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    cited = {i["value"].removeprefix("arXiv:") for r in cff["references"] for i in r.get("identifiers", [])}
    assert PAPERS <= cited
    bib = (ROOT / "CITATION.bib").read_text()
    assert PAPERS <= set(re.findall(r"\d{4}\.\d{5}", bib))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{cff["version"]}"' in pyproject
    assert f'license = "{cff["license"]}"' in pyproject
    assert "Apache License" in (ROOT / "LICENSE").read_text()  # the SmolLM2-derived drafts' licence travels along
