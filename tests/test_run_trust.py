"""What a run folder may make the library do: never run code named by its files (issue 30.5, 30.6).

A run folder is data. A resumed run takes its LLM backend from config.json only when that is a
registered name (a module path must come from the command line of the invocation); an SB3
model.zip is read for its parameters only, never unpickled, even when its checksum was rewritten
to match (docs/architecture.md, "What a run folder may contain").
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from agents.run.config import LLMConfig
from agents.pqn.config import preset
from agents.run.run_dir import CorruptFileError, RunDir

ROOT = Path(__file__).resolve().parents[1]


class _Touch:
    """Unpickles into a call that creates ``path``: the stand-in for any code a crafted file names."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _importable_run_dir(tmp_path: Path, monkeypatch) -> tuple[Path, Path, str]:
    """A run folder that is also an importable package (its parent on sys.path, as the working
    directory is for ``python -m`` or ``PYTHONPATH=.``) whose code creates a marker when imported;
    returns (run folder, marker, a backend spec naming a class in it)."""
    work = tmp_path / "work"
    run = work / "crafted_run"
    run.mkdir(parents=True)
    marker = tmp_path / "code_ran"
    code = f"import os\nos.makedirs({str(marker)!r}, exist_ok=True)\nclass Backend:\n    pass\n"
    (run / "__init__.py").write_text(code)
    (run / "evil.py").write_text(code)
    monkeypatch.syspath_prepend(str(work))
    return run, marker, "crafted_run.evil:Backend"


# ----------------------------------------------------------------------------- 30.5: backends named by files
def test_resume_refuses_a_module_backend_named_by_config_json(tmp_path, monkeypatch, capsys):
    """The run stopped before its first checkpoint, so --resume starts it again: its LLM would be
    built from config.json's llm.backend, a module in the run folder itself."""
    from agents.pqn import recipe

    run, marker, spec = _importable_run_dir(tmp_path, monkeypatch)
    cfg = preset("smoke").replace(**{"oir.relabeler": "llm", "llm.backend": spec})
    RunDir(run).write_config(cfg.to_dict())
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(SystemExit) as err:
        recipe.pqn_main(["--run-dir", str(run), "--resume", "--no-progress"])
    msg = str(err.value.code)
    assert f"{run / 'config.json'}: llm.backend='{spec}' is a Python module path" in msg
    assert "pass --llm.backend on the command line" in msg and "\n" not in msg
    assert not marker.exists() and "crafted_run.evil" not in sys.modules
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written
    # the command line of this invocation chooses the backend (it wins over the file)
    opts = recipe.PQN.parse(["--run-dir", str(run), "--resume", "--llm.backend", "openai"])
    assert opts.config.llm.backend == "openai" and opts.config.oir.relabeler == "llm"
    # ... a module path included: named on this command line, it is the user's choice (not imported here)
    opts = recipe.PQN.parse(["--run-dir", str(run), "--resume", "--llm.backend", spec])
    assert opts.config.llm.backend == spec and not marker.exists()


def test_sb3_resume_refuses_a_module_backend_named_by_config_json(tmp_path, monkeypatch, capsys):
    """The SB3 trainer refuses it the same way (one parser for both)."""
    pytest.importorskip("stable_baselines3")
    from agents.sb3.config import SB3TrainConfig
    from agents.sb3.trainer import sb3_main

    run, marker, spec = _importable_run_dir(tmp_path, monkeypatch)
    RunDir(run).write_config(SB3TrainConfig().replace(**{"oir.relabeler": "llm", "llm.backend": spec}).to_dict())
    with pytest.raises(SystemExit) as err:
        sb3_main(["--run-dir", str(run), "--resume"])
    msg = str(err.value.code)
    assert f"llm.backend='{spec}' is a Python module path" in msg and str(run / "config.json") in msg
    assert not marker.exists() and "crafted_run.evil" not in sys.modules
    assert not (run / "metrics.jsonl").exists()


def test_a_module_backend_is_used_only_when_the_command_line_names_it(tmp_path):
    from agents.run.config import check_saved_backend

    file = tmp_path / "config.json"
    for backend in ("transformers", "openai", "vllm", "llama_cpp"):  # registered names are data
        check_saved_backend(LLMConfig(backend=backend), file, on_command_line=False)
    check_saved_backend(LLMConfig(backend="my_pkg.llm:Backend"), file, on_command_line=True)
    with pytest.raises(ValueError, match=r"config.json: llm.backend='my_pkg.llm:Backend' is a Python module path"):
        check_saved_backend(LLMConfig(backend="my_pkg.llm:Backend"), file, on_command_line=False)


# ----------------------------------------------------------------------------- 30.6: SB3 zips are never unpickled
sb3 = pytest.importorskip("agents.sb3.models")

HP = dict(learning_starts=100, buffer_size=200, batch_size=32, policy_kwargs=dict(n_quantiles=5, net_arch=[16]))


def _sb3_run(path: Path, hyperparams=HP):
    """A run folder with a config and a checkpoint of an untrained QR-DQN (no env is stepped)."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("sb3_contrib")
    from agents.sb3.config import SB3TrainConfig

    cfg = SB3TrainConfig().replace(**{"sb3.algo": "qrdqn", "sb3.num_envs": 1, "sb3.hyperparams": dict(hyperparams)})
    run = RunDir.prepare(path)
    run.write_config(cfg.to_dict())
    model = sb3.make_model("qrdqn", sb3.spaces_only_venv(), seed=3, hyperparams=cfg.sb3.hyperparams, device="cpu")
    sb3.save_checkpoint(run.path, model, {"update": 0})
    return run.path, model


def _replace_members(zip_path: Path, **members: bytes) -> None:
    """Rewrite members of a zip (keeping the others)."""
    with zipfile.ZipFile(zip_path) as z:
        kept = {n: z.read(n) for n in z.namelist() if n not in members}
    with zipfile.ZipFile(zip_path, "w") as z:
        for name, data in {**kept, **members}.items():
            z.writestr(name, data)


def _obs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.random(888).astype(np.float32), "instruction": rng.uniform(-1, 1, 384).astype(np.float32)}


def test_a_swapped_model_zip_with_a_matching_checksum_runs_no_code(tmp_path):
    """Whoever can write the run folder replaces model.zip and the sha256 in state.json: loading
    (load_policy, record_video.py, train_sb3.py --resume) reads no pickle, so nothing runs."""
    from agents.tools.policy import load_policy

    from agents.tools import record_video

    run, _ = _sb3_run(tmp_path / "run")
    marker = tmp_path / "code_ran"
    payload = base64.b64encode(pickle.dumps(_Touch(marker))).decode()
    with zipfile.ZipFile(run / "model.zip", "w") as z:
        z.writestr("data", json.dumps({"policy_class": {":type:": "<class 'type'>", ":serialized:": payload}}))
    sb3.trust_model_zip(run)  # the checksum rewritten to match
    with pytest.raises(CorruptFileError, match=r"model.zip: lacks \['policy.pth', 'policy.optimizer.pth'\]"):
        load_policy(run, device="cpu")
    assert record_video.main([str(run), "drink water", "--out", str(tmp_path / "v.gif")]) == 2
    with pytest.raises(CorruptFileError, match="model.zip"):
        sb3.load_model("qrdqn", run / "model.zip", device="cpu")
    assert not marker.exists()
    pickle.loads(base64.b64decode(payload))  # the payload is live: SB3's own load would have run it
    assert marker.exists()


@pytest.mark.slow  # builds the run's env (about 30 s on 2 busy cores); the loader it reaches is tested above
def test_sb3_resume_of_a_swapped_model_zip_with_a_matching_checksum_runs_no_code(tmp_path, capsys):
    """train_sb3.py --resume checks the zip before it writes anything, and reads no pickle."""
    from agents.sb3.trainer import sb3_main

    run, _ = _sb3_run(tmp_path / "run")
    marker = tmp_path / "code_ran"
    payload = base64.b64encode(pickle.dumps(_Touch(marker))).decode()
    with zipfile.ZipFile(run / "model.zip", "w") as z:
        z.writestr("data", json.dumps({"policy_class": {":type:": "<class 'type'>", ":serialized:": payload}}))
    sb3.trust_model_zip(run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert sb3_main(["--run-dir", str(run), "--resume"]) == 2
    assert "model.zip: lacks" in capsys.readouterr().err
    assert not marker.exists()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing written


def test_a_real_model_with_pickles_put_in_its_data_loads_its_weights_and_runs_none(tmp_path):
    run, model = _sb3_run(tmp_path / "run")
    marker = tmp_path / "code_ran"
    with zipfile.ZipFile(run / "model.zip") as z:
        data = json.loads(z.read("data"))
    for key in ("observation_space", "lr_schedule", "exploration_schedule", "policy_class"):
        data[key] = {":type:": "<class 'object'>", ":serialized:": base64.b64encode(pickle.dumps(_Touch(marker))).decode()}
    _replace_members(run / "model.zip", data=json.dumps(data).encode())
    sb3.trust_model_zip(run)
    policy = sb3.load_sb3_policy(run, device="cpu")
    assert not marker.exists()
    for seed in range(5):  # the saved weights, in a model of the run's own class and config
        expected, _ = model.predict({k: v[None] for k, v in _obs(seed).items()}, deterministic=True)
        assert policy.act(_obs(seed)) == int(expected[0])
    assert policy.model.num_timesteps == model.num_timesteps


def test_non_finite_sb3_weights_are_refused_naming_the_file(tmp_path):
    import torch

    run, model = _sb3_run(tmp_path / "run")
    state = model.policy.state_dict()
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = torch.full_like(state[name], float("nan"))
    buf = io.BytesIO()
    torch.save(state, buf)
    _replace_members(run / "model.zip", **{"policy.pth": buf.getvalue()})
    sb3.trust_model_zip(run)
    with pytest.raises(CorruptFileError, match=rf"model.zip: parameter {name} holds NaN"):
        sb3.load_sb3_policy(run, device="cpu")


def test_a_zip_of_another_network_size_is_refused_naming_the_file(tmp_path):
    run, _ = _sb3_run(tmp_path / "run")
    cfg = json.loads((run / "config.json").read_text())
    cfg["sb3"]["hyperparams"]["policy_kwargs"]["net_arch"] = [32]
    (run / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CorruptFileError, match=r"model.zip: its parameters do not fit a qrdqn model"):
        sb3.load_sb3_policy(run, device="cpu")


def test_load_model_without_a_config_rebuilds_the_network_from_the_readable_data(tmp_path):
    """A bare zip (no run config): the hyperparameters come from data's plain JSON, QR-DQN's
    policy_kwargs too (SB3 pickles that dict because QR-DQN adds its optimizer class to it)."""
    _, model = _sb3_run(tmp_path / "run")
    model.num_timesteps = 1234
    model.save(tmp_path / "m.zip")
    loaded = sb3.load_model("qrdqn", tmp_path / "m.zip", device="cpu")
    assert loaded.policy.quantile_net.n_quantiles == 5 and loaded.num_timesteps == 1234
    for seed in range(3):
        obs = {k: v[None] for k, v in _obs(seed).items()}
        assert loaded.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]


# ----------------------------------------------------------------------------- 37.11: where a run connects, what it reads
def test_resume_refuses_a_server_and_template_named_by_config_json(tmp_path, capsys):
    """A stopped run's config.json edited to send the LLM's requests (and the API key) to another
    host with a template file of its own: --resume refuses before anything starts, naming the flags
    to repeat; repeated on the command line, they are the user's choice."""
    from agents.pqn import recipe

    run = tmp_path / "run"
    template = tmp_path / "t.txt"
    template.write_text("Describe: {{trajectory}}\n")
    host = "http://collector.invalid:9/v1"
    cfg = preset("smoke").replace(**{"oir.relabeler": "both", "llm.backend": "openai", "llm.base_url": host,
                                     "llm.template": str(template)})
    RunDir(run).write_config(cfg.to_dict())
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(SystemExit) as err:
        recipe.pqn_main(["--run-dir", str(run), "--resume", "--no-progress"])
    msg = str(err.value.code)
    assert msg.startswith(f"error: {run / 'config.json'} sets llm.base_url='{host}', llm.template='{template}'")
    assert f"repeat --llm.base-url {host} --llm.template {template} to use them again" in msg and "\n" not in msg
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written
    # named on this command line (either spelling), they are used; one of the two is not enough
    opts = recipe.PQN.parse(["--run-dir", str(run), "--resume", "--llm.base_url", host, f"--llm.template={template}"])
    assert (opts.config.llm.base_url, opts.config.llm.template) == (host, str(template))
    with pytest.raises(SystemExit, match=r"sets llm.template="):
        recipe.PQN.parse(["--run-dir", str(run), "--resume", "--llm.base-url", host])
    # an evaluation starts no LLM: it leaves them at their defaults and says so
    capsys.readouterr()
    opts = recipe.PQN.parse(["--run-dir", str(run), "--eval-only", "x"])
    assert (opts.config.llm.base_url, opts.config.llm.template) == (LLMConfig.base_url, LLMConfig.template)
    assert "warning: --eval-only does not use llm.base_url=" in capsys.readouterr().err


def test_which_fields_point_outside_a_run(tmp_path):
    """Every file or server a config names counts, a packaged name or a model name does not."""
    from agents.run.resume import OUTSIDE_FIELDS, outside_references

    assert outside_references(preset("smoke")) == {} and outside_references(preset("cpu")) == {}
    pool, mine, model = tmp_path / "pool.json", tmp_path / "mine.json", tmp_path / "model"
    model.mkdir()
    cfg = preset("smoke").replace(**{"llm.template": "paper", "llm.model": "google/gemma-3-270m-it"})
    assert outside_references(cfg) == {}
    cfg = cfg.replace(**{"llm.model": str(model), "oir.oracle_pool": str(pool), "eval.instruction_files": (str(mine),),
                         "llm.base_url": "https://example.invalid/v1", "llm.template": str(tmp_path / "t.txt")})
    assert set(outside_references(cfg)) == set(OUTSIDE_FIELDS)
