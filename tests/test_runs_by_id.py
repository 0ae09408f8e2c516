"""Runs read by id (retention's, compare's and the REST reader's one search form): every id found
however many there are, one search per RUN_IDS_PER_SEARCH ids, deleted runs only when asked."""

from __future__ import annotations

from mlflow import MlflowClient

from hpolab.stores.mlflow_rest import RUN_IDS_PER_SEARCH, run_id_filters
from hpolab.stores.mlflow_runs import runs_by_id


def test_the_filters_name_each_id_once_in_searches_of_at_most_the_chunk_size():
    ids = [f"{i:032x}" for i in range(2 * RUN_IDS_PER_SEARCH + 5)]
    filters = list(run_id_filters(ids + ids[:7]))  # (a repeated id is searched once)
    assert [n for n, _ in filters] == [RUN_IDS_PER_SEARCH, RUN_IDS_PER_SEARCH, 5]
    named = [r.strip("' ") for _, f in filters for r in f.removeprefix("attributes.run_id IN (").removesuffix(")").split(",")]
    assert sorted(named) == sorted(ids)
    assert list(run_id_filters([])) == []


def test_runs_by_id_finds_more_runs_than_one_search_names_and_deleted_ones_when_asked(store):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.create_experiment("e", artifact_location=str(store / "artifacts"))
    other = client.create_run(client.create_experiment("other", artifact_location=str(store / "artifacts"))).info.run_id
    ids = [client.create_run(exp).info.run_id for _ in range(RUN_IDS_PER_SEARCH + 3)]
    client.delete_run(ids[0])
    wanted = ids[:-1] + [other]  # (another experiment's run is not found in this one)

    assert set(runs_by_id(client, exp, wanted)) == set(ids[1:-1])
    found = runs_by_id(client, exp, wanted, deleted=True)
    assert set(found) == set(ids[:-1])
    assert all(found[r].info.run_id == r for r in found)
