"""docs/errors.md's table is true: each example prints its message, on one line (issue 13)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pipeweave.cli.main import main

TABLE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def rows() -> list[tuple[str, str]]:
    found = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`pipeweave "):
            found.append((cells[1].strip("`"), cells[2].strip("`")))
    return found


ROWS = rows()


def test_the_table_has_its_rows() -> None:
    assert len(ROWS) >= 20


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("command", "message"), ROWS, ids=[c for c, _ in ROWS])
def test_each_error_is_one_line_with_its_message(command: str, message: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    if argv[0] == "train":
        argv.append("--no-progress")
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (1, 2), (command, code, err)
    errors = [line for line in err.splitlines() if line.startswith("pipeweave")]
    assert len(errors) == 1 and message in errors[0], (command, err)
    assert "Traceback" not in err
