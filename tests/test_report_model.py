"""The typed report model: the committed schema is generated from it, the JSON document is the model's,
and the verdict categories come from one data file read by every consumer."""

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from analyzer.api import analyze
from analyzer.categories import CATEGORIES, CategoryError, categories, outcome_of
from analyzer.render.json_report import render_json
from analyzer.report import SCHEMA_VERSION, HostFacts, RankFacts, Report, ReportModelError, document, field_meta, from_record
from analyzer.report_schema import json_schema, schema_text

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / "schema" / "report.schema.json"
CASE = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
HEALTHY = ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"


def test_the_committed_schema_is_generated_from_the_model():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), (
        "schema/report.schema.json is stale: run `python -m analyzer.report_schema > schema/report.schema.json`")


def test_the_schema_is_valid_and_names_its_version():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"].endswith(f"report-{SCHEMA_VERSION}.json")
    assert f"documents {SCHEMA_VERSION})" in schema["description"]


def test_the_schema_enum_is_the_categories_file():
    assert json_schema()["$defs"]["category"]["enum"] == [c.id for c in categories()]
    raw = tomllib.loads((ROOT / "schema" / "categories.toml").read_text())
    assert [c["id"] for c in raw["category"]] == [c.id for c in categories()]


def test_keys_added_in_a_minor_version_are_optional():
    job = json_schema()["properties"]["job"]
    assert "time_span" not in job["required"] and job["properties"]["time_span"]["description"].startswith("Optional (1.3)")
    assert {"path", "world_size", "ranks", "hosts", "outcome"} <= set(job["required"])


@pytest.mark.parametrize("job", [CASE, HEALTHY], ids=["failure", "healthy"])
def test_document_round_trips_through_the_model(job):
    result = analyze(job)
    assert isinstance(result.model, Report)
    assert result.report == document(result.model)
    assert from_record(Report, result.report) == result.model
    jsonschema.validate(result.report, json.loads(SCHEMA_FILE.read_text()))


def test_render_json_is_the_document_in_field_order():
    result = analyze(CASE)
    text = render_json(result.model)
    assert text.endswith("}\n") and json.loads(text) == result.report
    assert list(json.loads(text)) == ["schema_version", "analyzer_version", "job", "verdict", "findings", "inputs",
                                      "problems", "checkpoints"]
    assert list(json.loads(text)["verdict"])[-1] == "culprit_gpus"


def test_a_record_with_a_key_outside_the_model_is_refused():
    record = document(from_record(HostFacts, _host_record()))
    with pytest.raises(ReportModelError, match="keys outside the report model: \\['new_fact'\\]"):
        from_record(HostFacts, {**record, "new_fact": "x"})
    missing = {k: v for k, v in record.items() if k != "host"}
    with pytest.raises(ReportModelError, match="host"):
        from_record(HostFacts, missing)


def test_per_rank_facts_are_flattened_and_env_left_out_when_absent():
    rank = from_record(RankFacts, {"rank": 3, "pid": 7, "nccl_version": "2.18.1"})
    assert rank.facts == {"nccl_version": "2.18.1"} and rank.env is None
    assert document(rank) == {"rank": 3, "pid": 7, "nccl_version": "2.18.1"}
    with_env = {"rank": 3, "pid": 7, "env": {"NCCL_DEBUG": "INFO"}}
    assert document(from_record(RankFacts, with_env)) == with_env
    per_rank = json_schema()["properties"]["job"]["properties"]["host_facts"]["items"]["properties"]["per_rank"]["items"]
    assert per_rank["required"] == ["rank", "pid"] and per_rank["additionalProperties"] == {"type": ["string", "null"]}


def _host_record() -> dict:
    facts = {name: None for name, meta in field_meta(HostFacts) if not meta.required and name != "known_issues"}
    return {"host": "node-1", "ranks": [0], "addresses": [], **facts, "env": {}, "duplicate_name": False, "differs": [],
            "per_rank": [], "known_issues": []}


def test_outcomes_come_from_the_categories_file():
    assert outcome_of("nccl_timeout") == "hang" and outcome_of("straggler") == "slow"
    assert outcome_of("rank_crash_exception_then_hang") == "crash"
    assert {c.outcome for c in categories()} == {"none", "crash", "hang", "slow"}
    assert [c.id for c in categories() if c.outcome == "none"] == ["none"]


def test_every_rule_category_is_in_the_file():
    from analyzer.rules import CATEGORIES as RULE_CATEGORIES, catalogue

    assert RULE_CATEGORIES is CATEGORIES
    assert {r.category for r in catalogue()} <= CATEGORIES


@pytest.mark.parametrize("text, error", [
    ('[[category]]\nid = "none"\noutcome = "none"\nhangs = false\n', "keys must be"),
    ('[[category]]\nid = "none"\noutcome = "gone"\nhangs = false\ndescription = "x"\n', "outcome must be one of"),
    ('[[category]]\nid = "a"\noutcome = "crash"\nhangs = false\ndescription = "x"\n', "include 'none'"),
    ('[[category]]\nid = "none"\noutcome = "none"\nhangs = false\ndescription = "x"\n'
     '[[category]]\nid = "none"\noutcome = "none"\nhangs = false\ndescription = "x"\n', "unique"),
])
def test_a_malformed_categories_file_is_named(tmp_path, text, error):
    path = tmp_path / "categories.toml"
    path.write_text(text)
    with pytest.raises(CategoryError, match=error) as caught:
        categories(path)
    assert str(path) in str(caught.value)


def test_records_of_earlier_stages_keep_their_key_order_in_the_model():
    """The model's field order is the document's key order: the tables other stages produce must agree."""
    from analyzer.facts.checkpoint_audit import CHECKPOINT_SCHEMA
    from analyzer.facts.gpus import _OUT as GPU_COLUMNS
    from analyzer.facts.hostfacts import FACTS
    from analyzer.report import Checkpoint, CulpritGpu

    names = [name for name, _ in field_meta(HostFacts)]
    assert names[names.index("addresses") + 1:names.index("env")] == [name for name, _ in FACTS]
    assert [name for name, _ in field_meta(Checkpoint)] == list(CHECKPOINT_SCHEMA)
    assert [name for name, _ in field_meta(CulpritGpu)] == GPU_COLUMNS
