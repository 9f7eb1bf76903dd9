"""A `reactq` command ends with every object it made frozen (gc.freeze), so the interpreter's teardown does
not run the cyclic collector over the imports' objects (~60 ms of CPU a command; BENCHMARKS.md)."""

from __future__ import annotations

import gc

import pytest

from worker.cli.main import main


def test_a_command_leaves_its_objects_frozen_for_the_teardown_and_keeps_its_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    gc.unfreeze()
    try:
        for argv, code in ((["reactq", "--help"], 0), (["reactq", "no-such-verb"], 2)):
            monkeypatch.setattr("sys.argv", argv)
            with pytest.raises(SystemExit) as exited:
                main()
            assert exited.value.code == code
            assert gc.get_freeze_count() > 10_000  # the imports' objects, not a handful
            gc.unfreeze()
    finally:
        gc.unfreeze()
    assert "reactq" in capsys.readouterr().out
