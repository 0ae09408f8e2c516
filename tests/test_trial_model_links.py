"""`hpolab compare` and `hpolab report` link each trial to its logged model: compare's rows carry the
model's id, name and `models:/` URI; the report links the model's page in the MLflow UI when it knows
the UI's address (`--ui-url`, or the tracking server's own), else shows the URI. A trial whose model
retention deleted shows none: no row or link points at a deleted model.

The store is a copy of the shared tiny study (conftest.mixed_study_template: two COMPLETE trials, a
FAIL and a PRUNED one) after `hpolab study prune-files --keep 1`, which deletes the worse COMPLETE
trial's model as `log_models: {top_k: 1}` would have.
"""

from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from conftest import STUDY, copy_store, hpolab_env, mixed_study_template, open_study, run_cli


@pytest.fixture(scope="module")
def pruned_store(tmp_path_factory, migrated_store):
    store = copy_store(mixed_study_template(tmp_path_factory, migrated_store), tmp_path_factory.mktemp("links") / "store")
    run_cli("--store", str(store), "study", "prune-files", STUDY, "--keep", "1", "--yes")
    return store


def _kept_and_deleted(store):
    """(client, study, the kept trial, the trial whose model retention deleted, that model's id)."""
    client, study = open_study(store, STUDY)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    kept = study.best_trial
    (gone,) = [t for t in complete if t.number != kept.number]
    tags = client.get_run(gone.user_attrs["mlflow_run_id"]).data.tags
    assert "hpolab.model_deleted" in tags  # prune-files deleted it: the run still names it
    with pytest.raises(MlflowException):
        client.get_logged_model(tags["hpolab.model_id"])
    return client, study, kept, gone, tags["hpolab.model_id"]


@pytest.mark.slow
def test_compare_names_each_trials_logged_model(pruned_store):
    from hpolab.analysis.compare.study import load_study_table
    from hpolab.stores.paths import resolve_stores

    client, study, kept, gone, deleted_id = _kept_and_deleted(pruned_store)
    rows = json.loads(run_cli("--store", str(pruned_store), "compare", STUDY, "--format", "json").stdout)
    by_trial = {r["trial"]: r for r in rows}
    model = client.get_logged_model(by_trial[kept.number]["model_id"])  # resolves: a live model
    assert model.source_run_id == kept.user_attrs["mlflow_run_id"] == by_trial[kept.number]["run_id"]
    assert by_trial[kept.number]["model_name"] == model.name == f"{STUDY}-trial-{kept.number}"
    assert by_trial[kept.number]["model_uri"] == f"models:/{model.model_id}"
    for t in study.trials:
        if t.number != kept.number:  # deleted by retention, or never logged (PRUNED, FAIL)
            assert (by_trial[t.number]["model_id"], by_trial[t.number]["model_name"], by_trial[t.number]["model_uri"]) == (None, None, None)

    # the same columns through Optuna and MlflowClient (an MLflow server's path) as through plain SQL
    through_client = load_study_table(STUDY, resolve_stores(str(pruned_store))).frame
    assert json.loads(through_client.set_index("trial")[["model_id", "model_name", "model_uri"]].to_json(orient="index")) == \
        {str(n): {k: r[k] for k in ("model_id", "model_name", "model_uri")} for n, r in by_trial.items()}

    csv = pd.read_csv(io.StringIO(run_cli("--store", str(pruned_store), "compare", STUDY, "--format", "csv").stdout))
    assert list(csv.loc[csv["trial"] == kept.number, "model_uri"]) == [f"models:/{model.model_id}"]
    assert csv.loc[csv["trial"] != kept.number, "model_id"].isna().all()

    # the table: a `model` column with the kept model's id, in full where it fits, shortened where not
    env = hpolab_env()
    env["COLUMNS"] = "230"
    wide = run_cli("--store", str(pruned_store), "compare", STUDY, env=env).stdout
    (header,) = [line for line in wide.splitlines() if "run id" in line]
    assert header.rstrip().endswith("model") and model.model_id in wide and deleted_id[:10] not in wide
    env["COLUMNS"] = "100"
    narrow = run_cli("--store", str(pruned_store), "compare", STUDY, env=env).stdout
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 100
    assert model.model_id[:10] in narrow or re.search(r"left out to fit the terminal: [^(]*model_id", " ".join(narrow.split()))


class Links(HTMLParser):
    def __init__(self, text: str):
        super().__init__()
        self.hrefs: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "a" and dict(attrs).get("href", "").startswith("http"):
            self.hrefs.append(dict(attrs)["href"])


@pytest.mark.slow
def test_report_links_each_trial_to_its_logged_model(pruned_store, tmp_path):
    client, study, kept, gone, deleted_id = _kept_and_deleted(pruned_store)
    exp = client.get_experiment_by_name(STUDY).experiment_id
    model_id = client.get_run(kept.user_attrs["mlflow_run_id"]).data.tags["hpolab.model_id"]
    model = client.get_logged_model(model_id)

    # no UI address known (an embedded store): the model's URI, no links
    plain = tmp_path / "plain.html"
    run_cli("--store", str(pruned_store), "report", STUDY, "--out", str(plain))
    html = plain.read_text()
    assert f"models:/{model.model_id}" in html and deleted_id not in html
    assert Links(html).hrefs == []

    # `--ui-url`: the model's page and the run's page in that MLflow UI (its routes, MLflow 3)
    ui = "http://127.0.0.1:5123"
    linked = tmp_path / "linked.html"
    run_cli("--store", str(pruned_store), "report", STUDY, "--out", str(linked), "--ui-url", ui + "/")
    html = linked.read_text()
    hrefs = Links(html).hrefs
    assert f"{ui}/#/experiments/{exp}/models/{model.model_id}" in hrefs
    assert f"{ui}/#/experiments/{exp}/runs/{kept.user_attrs['mlflow_run_id']}" in hrefs
    assert f"{ui}/#/experiments/{exp}/runs/{gone.user_attrs['mlflow_run_id']}" in hrefs  # its run stays
    assert f"{ui}/#/experiments/{exp}/models?workflowType=machine_learning" in hrefs  # the Models tab
    assert not any(deleted_id in h for h in hrefs) and deleted_id not in html
    # the model's name is the link's text (it names the study and trial)
    assert re.search(rf'<a href="{re.escape(ui)}/#/experiments/{exp}/models/{model.model_id}"[^>]*>{re.escape(model.name)}</a>', html)


@pytest.mark.parametrize("url", ["127.0.0.1:5000", "ftp://host/", "http://"])
def test_report_refuses_a_ui_url_that_is_not_a_web_address(store, url):
    proc = run_cli("--store", str(store), "report", "any", "--ui-url", url, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--ui-url" in proc.stderr and "http://127.0.0.1:5000" in proc.stderr


def test_the_ui_address_of_a_tracking_server_never_carries_its_login():
    from hpolab.analysis.report.trials import ui_url_of

    assert ui_url_of("http://alice:s3cret@mlflow.example:5000/", None) == "http://mlflow.example:5000"
    assert ui_url_of("https://mlflow.example/team/", None) == "https://mlflow.example/team"
    assert ui_url_of("sqlite:////tmp/store/mlflow.db", None) is None  # an embedded store: no UI known
    assert ui_url_of("sqlite:////tmp/store/mlflow.db", "http://127.0.0.1:5000/") == "http://127.0.0.1:5000"
    assert ui_url_of("http://alice:s3cret@mlflow.example:5000", "https://ui.example") == "https://ui.example"
