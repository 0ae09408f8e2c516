"""Study spec: YAML + overrides -> frozen, validated StudySpec; every problem named at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import ROOT, hpolab_env, live_processes, run_cli
from hpolab.config.spec import SpecError, load_spec, parse_overrides

DEFAULT = "studies/digits_cnn.yaml"


def test_default_spec_loads_and_overrides_are_yaml_typed():
    spec = load_spec(DEFAULT, ["n_trials=4", "trainer.max_epochs=3", "trainer.lr=0.01", "model.channels=8", "timeout=null"])
    assert spec.n_trials == 4 and spec.trainer.max_epochs == 3 and spec.trainer.lr == 0.01
    assert spec.model["channels"] == 8 and spec.timeout is None
    assert spec.storage_outage_grace == 120  # seconds the driver rides out an unreachable store
    with pytest.raises(ValidationError):
        spec.n_trials = 5  # frozen


def test_search_space_override_by_dotted_path():
    spec = load_spec(DEFAULT, ["search_space.trainer.lr.high=0.1"])
    assert spec.search_space["trainer.lr"].high == 0.1


def test_every_problem_is_reported_with_its_path():
    with pytest.raises(SpecError) as e:
        load_spec(DEFAULT, ["model.widht=3", "metric=val_loss", "pruner={type: bogus}", "sampler.kwargs.nope=1",
                            "search_space.trainer.nonsense={type: int, low: 1, high: 2}"])
    text = "\n".join(e.value.problems)
    assert "model.widht: unknown key for experiment digits_cnn" in text
    assert "direction: val_loss should be minimized" in text
    assert "pruner.type: unknown pruner 'bogus'" in text
    assert "sampler.kwargs: tpe rejects them" in text
    assert "search_space.trainer.nonsense: trainer has no key 'nonsense'" in text
    assert len(e.value.problems) == 5


@pytest.mark.parametrize(
    "override, expected",
    [
        ("trainer.lrr=1", "trainer.lrr: unknown key"),
        ("trainer.batch_size=0", "trainer.batch_size: batch_size must be >= 1"),
        ("trainer.optimizer=lamb", "trainer.optimizer"),
        ("n_trials=0", "n_trials"),
        ("search_space.trainer.lr.low=-1", "log: true needs low > 0"),
        ("name=has space", "name: "),
        ("experiment=nothere", "experiment: experiment 'nothere' not found"),
        ("bogus_top_level=1", "bogus_top_level: unknown key"),
        ("storage_outage_grace=-1", "storage_outage_grace: Input should be greater than or equal to 0"),
    ],
)
def test_bad_values_name_the_field(override, expected):
    with pytest.raises(SpecError) as e:
        load_spec(DEFAULT, [override])
    assert expected in "\n".join(e.value.problems)


def test_bad_override_syntax():
    with pytest.raises(SpecError, match="write key=value"):
        parse_overrides(["trainer.lr"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


@pytest.mark.parametrize("start", ["fork", "new"])
def test_cli_reports_spec_errors_without_traceback(store, tmp_path, start):
    """One clear error, nothing half-written, and nothing of the command left running. Its trials'
    forkserver is a fork of the command taken after the check (start=fork: nothing to stop), or, where
    it cannot be (HPOLAB_FORKSERVER=new), a new interpreter started before the check
    (trial_forkserver.start_early), which a spec that fails the check stops before the error is printed
    (not seconds later, once it has imported torch). The command runs in its own process group, its
    output to files (a pipe would make us wait for the last process holding it), so anything left
    behind is seen in that group when it exits."""
    exe = Path(sys.executable).with_name("hpolab")
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen([str(exe), "--store", str(store), "study", "run", DEFAULT, "trainer.lrr=1", "model.widht=2"],
                                cwd=ROOT, env={**hpolab_env(), "HPOLAB_FORKSERVER": start}, stdout=o, stderr=e,
                                start_new_session=True)
        proc.wait(timeout=300)
    assert not [cmd for _, group, cmd in live_processes().values() if group == proc.pid]
    assert proc.returncode == 2
    assert "invalid study spec" in err.read_text() and "trainer.lrr" in err.read_text()
    assert "Traceback" not in err.read_text()
    assert not (store / "trials").exists()  # nothing half-written


def test_an_experiment_that_fails_to_import_is_one_line_from_the_check_and_silent_in_the_forkserver(store, tmp_path):
    """The forkserver starts before the check and imports the experiment too: its failure there must not
    reach the terminal as a traceback (multiprocessing's preload lets all but ImportError escape)."""
    project = tmp_path / "project"
    (project / "experiments").mkdir(parents=True)
    (project / "studies").mkdir()
    (project / "experiments" / "broken.py").write_text('raise ValueError("boom at import")\n')
    (project / "studies" / "s.yaml").write_text((ROOT / DEFAULT).read_text().replace("experiment: digits_cnn", "experiment: broken"))
    out = run_cli("--store", str(store), "study", "run", str(project / "studies" / "s.yaml"), cwd=tmp_path, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "experiment: importing 'broken' failed: ValueError: boom at import" in out.stderr
    assert "Traceback" not in out.stdout + out.stderr

    # The forkserver's side on its own (in the race above the check may fail before it gets there):
    env = {**hpolab_env(), "HPOLAB_FORKSERVER_EXPERIMENT": "experiments.broken", "PYTHONPATH": str(project)}
    preload = subprocess.run([sys.executable, "-c", "import hpolab.study.trials.experiment_preload"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=300)
    assert preload.returncode == 0 and preload.stderr == "", preload.stderr


def test_cli_validate_prints_resolved_spec():
    out = run_cli("study", "validate", DEFAULT, "n_trials=7")
    assert "valid" in out.stdout and "n_trials: 7" in out.stdout


def test_amp_off_reads_as_the_mode_not_as_false(tmp_path):
    # YAML 1.1 reads a bare `off` as false; both the file and a key=value override must mean amp "off".
    spec = tmp_path / "s.yaml"
    spec.write_text((ROOT / "studies" / "digits_cnn.yaml").read_text().replace("trainer:", "trainer:\n  amp: off", 1))
    assert load_spec(spec).trainer.amp == "off"
    assert load_spec(ROOT / "studies" / "digits_cnn.yaml", ["trainer.amp=off"]).trainer.amp == "off"


def test_the_check_of_a_spec_with_a_trial_scheduler_looks_its_experiment_up_once(monkeypatch):
    """The trial-scheduler checks take the experiment module the spec check loaded (PBT reads its
    MODEL_DEFAULTS / DATA_DEFAULTS) instead of a second load_experiment: counted around the real one."""
    import hpolab.config.spec as spec_module

    calls, real = [], spec_module.load_experiment

    def counted(name, search_from=None):
        calls.append(name)
        return real(name, search_from=search_from)

    monkeypatch.setattr(spec_module, "load_experiment", counted)
    for path in ("studies/digits_asha.yaml", "studies/digits_pbt.yaml"):
        calls.clear()
        assert load_spec(ROOT / path).trial_scheduler is not None
        assert calls == ["digits_cnn"], (path, calls)
    # data.augment is a key of the experiment's DATA_DEFAULTS only (not in the spec): the module was passed
    calls.clear()
    pbt = load_spec(ROOT / "studies/digits_pbt.yaml", ["trial_scheduler.mutations={data.augment: {choices: [true, false]}}"])
    assert list(pbt.trial_scheduler.mutations) == ["data.augment"] and calls == ["digits_cnn"]
    with pytest.raises(SpecError, match="trial_scheduler.mutations.data.nope: not a searched or config key"):
        load_spec(ROOT / "studies/digits_pbt.yaml", ["trial_scheduler.mutations={data.nope: {choices: [1, 2]}}"])
