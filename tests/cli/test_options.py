"""``--option KEY=VALUE`` means the same to every command (issue 14: one parser)."""

from __future__ import annotations

import argparse

import pytest

from pipeweave.cli.cmd_train import add_parser as add_train, build_job
from pipeweave.cli.main import main
from pipeweave.cli.options import parse_option


@pytest.mark.parametrize(("text", "value"), [
    ("vertical_sync=True", True), ("vertical_sync=false", False), ("advance=2", 2),
    ("alpha=0.5", 0.5), ("groups=[1, 2]", [1, 2]), ("mode=auto", "auto"), ("empty=", ""),
])
def test_values_are_typed_once_for_every_command(text: str, value: object) -> None:
    assert parse_option(text) == (text.partition("=")[0], value)


def test_train_accepts_what_show_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "pipedream", "-P", "2", "-M", "2", "--option", "vertical_sync=True"]) == 0
    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    job = build_job(parser.parse_args(["train", "--schedule", "pipedream", "--option",
                                       "vertical_sync=True"]))
    assert job.plan.schedule_options == {"vertical_sync": True}


def test_a_pair_without_equals_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--option", "vertical_sync"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: option 'vertical_sync' is not KEY=VALUE")
