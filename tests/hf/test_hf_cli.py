"""The command line takes the hf-* models and --hf-config like the built-in models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import transformers  # noqa: E402

from pipeweave.cli.main import main  # noqa: E402
from pipeweave.runtime import Plan  # noqa: E402

SMALL = ["--steps", "2", "--batch-size", "4", "--seq-len", "16", "--no-progress",
         "--executor", "local"]


@pytest.mark.parametrize(("model", "schedule"), [("hf-gpt2", "1f1b"), ("hf-llama", "gpipe")])
def test_train_a_preset(model: str, schedule: str, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--model", model, "--schedule", schedule, *SMALL,
                 "--output-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["losses"]) == 2 and all(4.0 < loss < 7.0 for loss in summary["losses"])


def _gpt2_config(tmp_path: Path, **fields: object) -> str:
    path = tmp_path / "config.json"
    transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=16, vocab_size=256,
                            **fields).to_json_file(str(path))
    return str(path)


def test_profile_plan_and_train_from_a_config_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = _gpt2_config(tmp_path, tie_word_embeddings=False)
    profile, plan = tmp_path / "profile.json", tmp_path / "plan.json"
    assert main(["profile", "--hf-config", config, "--batch-size", "2", "--seq-len", "16",
                 "--warmup", "0", "--repeats", "1", "--no-link", "--json-out", str(profile)]) == 0
    assert main(["plan", "--profile", str(profile), "--hf-config", config, "--ranks", "2",
                 "--method", "uniform", "--out", str(plan)]) == 0
    assert Plan.load(plan).num_blocks == 4
    code = main(["train", "--hf-config", config, "--plan", str(plan), *SMALL,
                 "--output-dir", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err


def test_tied_config_trains_split_over_stages(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = _gpt2_config(tmp_path)  # GPT-2's default: tied word embeddings
    code = main(["train", "--hf-config", config, *SMALL, "--output-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err


def test_tied_config_with_a_stale_schedule_is_one_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = _gpt2_config(tmp_path)
    assert main(["train", "--hf-config", config, *SMALL, "--schedule", "pipedream",
                 "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ties 0.wte.weight and 3.lm_head.weight" in err
    assert "schedule 'pipedream' runs the forward of micro-batch" in err
    assert "tie_word_embeddings=False" in err


def test_one_stage_keeps_the_tie(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _gpt2_config(tmp_path)
    code = main(["train", "--hf-config", config, "--stages", "1", *SMALL,
                 "--output-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err


def test_config_and_model_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _gpt2_config(tmp_path)
    assert main(["train", "--hf-config", config, "--model", "hf-llama", *SMALL]) == 2
    assert ("is a gpt2 model but --model is hf-llama; drop --model or use --model hf-gpt2"
            in capsys.readouterr().err)


def test_unsupported_architecture_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bert.json"
    path.write_text(json.dumps({"model_type": "bert"}))
    assert main(["train", "--hf-config", str(path), *SMALL]) == 2
    assert "model_type 'bert' is not supported" in capsys.readouterr().err
    assert main(["train", "--hf-config", str(tmp_path / "missing.json"), *SMALL]) == 2
    assert "no such file" in capsys.readouterr().err


def test_without_transformers_an_hf_model_is_one_line_with_the_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A machine without the extra: the fix on one line, no traceback."""
    import sys

    monkeypatch.chdir(tmp_path)
    from pipeweave.cli.main import main
    from pipeweave.models import registry

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    for name in [m for m in sys.modules if m.startswith("pipeweave.hf")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(registry, "_MODELS", {k: v for k, v in registry._MODELS.items()
                                              if not k.startswith("hf-")})
    assert main(["train", "--model", "hf-gpt2", "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "needs the transformers package: pip install -e '.[hf]'" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_auto_hint_names_the_config_not_the_preset(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The plan is for the config's model: the hint says --hf-config, not --model hf-gpt2."""
    config = _gpt2_config(tmp_path)
    profile = tmp_path / "profile.json"
    assert main(["profile", "--hf-config", config, "--batch-size", "2", "--seq-len", "16",
                 "--warmup", "0", "--repeats", "1", "--no-link", "--no-runtime-costs",
                 "--json-out", str(profile)]) == 0
    capsys.readouterr()
    assert main(["auto", "--hf-config", config, "--profile", str(profile), "--ranks", "2",
                 "--no-calibration", "--schedules", "1f1b", "--out", str(tmp_path / "plan.json"),
                 "--plot", str(tmp_path / "front.png")]) == 0
    out = capsys.readouterr().out
    assert f"pipeweave train --hf-config {config} --plan" in out and "--model hf-gpt2" not in out
