"""`hpolab launch slurm --dry-run`: the script it renders, the stores it accepts, and the errors it
gives (no Slurm needed; tests/test_launch_slurm.py submits to a real one)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from conftest import ROOT
from hpolab.cli import main
from hpolab.launch.workers import read_dotenv
from hpolab.stores.environment import scheduler_tags

SPEC = str(ROOT / "studies" / "digits_cnn.yaml")


def _dry_run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["launch", "slurm", SPEC, *args, "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


def test_script_is_one_array_job_that_execs_the_worker(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, script, err = _dry_run(capsys, "n_trials=8", "trainer.lr=0.01", "--workers", "3", "--single-node",
                                 "--gpus-per-worker", "2", "--cpus-per-worker", "4", "--partition", "gpu",
                                 "--time", "04:00:00", "--requeue", "--store", str(tmp_path / "st"))
    assert code == 0, err
    for line in ("#SBATCH --array=0-2", "#SBATCH --gres=gpu:2", "#SBATCH --cpus-per-task=4", "#SBATCH --partition=gpu",
                 "#SBATCH --time=04:00:00", "#SBATCH --requeue", f"#SBATCH --chdir={tmp_path}", "#SBATCH --nodelist=" + socket.gethostname().split(".")[0]):
        assert line in script.splitlines(), (line, script)
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec ") and f"--store {tmp_path / 'st'} worker {SPEC} n_trials=8 trainer.lr=0.01" in last
    assert f"export OPTUNA_STORAGE=sqlite:///{tmp_path / 'st' / 'optuna.db'}" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # valid shell
    assert not (tmp_path / "slurm-logs").exists()  # a dry run writes nothing


def test_sqlite_store_is_refused_for_several_nodes_with_the_fix(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _dry_run(capsys, "--workers", "2")
    assert code == 2 and out == ""
    assert "local to one machine" in err and "--storage postgresql" in err and "mlflow server" in err
    assert "--single-node" in err and "Traceback" not in err


def test_password_urls_travel_in_the_environment_not_the_script(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPTUNA_STORAGE", "postgresql+psycopg2://hpolab:s3cret@db:5432/optuna")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    code, script, err = _dry_run(capsys, "--workers", "2")
    assert code == 0, err
    assert "s3cret" not in script
    assert ': "${OPTUNA_STORAGE:?' in script and "hpolab:***@db" in script
    assert "export MLFLOW_TRACKING_URI=http://mlflow.internal:5000" in script


def test_stores_from_dotenv(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("# shared stores\nexport OPTUNA_STORAGE='grpc://proxy:13000'\n"
                                   'MLFLOW_TRACKING_URI="http://mlflow:5000"\nPOSTGRES_PASSWORD=x\n')
    assert read_dotenv(tmp_path / ".env")["OPTUNA_STORAGE"] == "grpc://proxy:13000"
    code, script, err = _dry_run(capsys, "--workers", "2")
    assert code == 0, err
    assert "export OPTUNA_STORAGE=grpc://proxy:13000" in script and "export MLFLOW_TRACKING_URI=http://mlflow:5000" in script


@pytest.mark.parametrize("args, says", [
    (["--workers", "0", "--single-node"], "--workers 0"),
    (["--workers", "2", "--single-node", "--time", "4h"], "--time '4h'"),
    (["--workers", "2", "--single-node", "--gpus-per-worker", "-1"], "--gpus-per-worker -1"),
])
def test_bad_arguments_are_one_clear_error(capsys, tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    code, out, err = _dry_run(capsys, *args)
    assert code == 2 and says in err and "Traceback" not in err


def test_missing_spec_is_one_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["launch", "slurm", "nope.yaml", "--workers", "2", "--single-node", "--dry-run"])
    assert code == 2 and "nope.yaml" in capsys.readouterr().err


def test_scheduler_tags_name_the_slurm_job_and_node():
    env = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1", "SLURMD_NODENAME": "gpu-07",
           "PATH": "/usr/bin"}
    assert scheduler_tags(env) == {"env.slurm_job_id": "41", "env.slurm_array_job_id": "40",
                                   "env.slurm_array_task_id": "1", "env.slurm_node": "gpu-07"}
    assert scheduler_tags({"JOB_COMPLETION_INDEX": "3"}) == {"env.k8s_job_completion_index": "3"}
    assert scheduler_tags({}) == {}


def test_mlflow_credentials_from_dotenv_are_required_of_the_job_environment_not_written(capsys, tmp_path, monkeypatch):
    """Stores and MLflow credentials from ./.env: the script names the variables the job environment
    must hold (sbatch exports them; `launch slurm` passes them to sbatch), never their values."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("OPTUNA_STORAGE=postgresql+psycopg2://hpolab:c2Vj/cmV0+QQ==@db:5432/optuna\n"
                                   "MLFLOW_TRACKING_URI=https://mlflow.example.com\n"
                                   "MLFLOW_TRACKING_USERNAME=hpolab\nMLFLOW_TRACKING_PASSWORD=mlflow-Pa55\n")
    code, script, err = _dry_run(capsys, "--workers", "2")
    assert code == 0, err
    assert "c2Vj" not in script and "mlflow-Pa55" not in script
    for var in ("OPTUNA_STORAGE", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert f': "${{{var}:?' in script, (var, script)
    assert "export MLFLOW_TRACKING_URI=https://mlflow.example.com" in script
    # the follow-up names the stores (the one with a password by its variable), not ./mlruns
    assert '--storage "$OPTUNA_STORAGE" --tracking-uri https://mlflow.example.com study status digits-cnn' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
