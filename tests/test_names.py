"""Queue and task names are defined once: in worker/names.py, or, for the exchange with the sandbox, in
tools_sandbox/base/names.py (which worker/names.py imports); no module imports the Celery app just to read a
name."""

from __future__ import annotations

from pathlib import Path

from tests.test_layering import ROOT, imported_modules, resolve
from worker import names


def test_names_is_pure() -> None:
    assert imported_modules(ROOT / "worker" / "names.py") == {"tools_sandbox.base.names"}
    assert imported_modules(ROOT / "tools_sandbox" / "base" / "names.py") == set()


def test_tools_sandbox_spells_its_task_names_once() -> None:
    for path in (ROOT / "tools_sandbox").rglob("*.py"):
        if path.name == "names.py":
            continue
        for name in (names.SANDBOX_TASK, names.STEP_TASK):  # (the queue's name is also a container label)
            assert f'"{name}"' not in path.read_text(), f"{path.relative_to(ROOT)} spells out {name!r}"


def test_only_the_task_module_and_the_worker_command_import_the_celery_app() -> None:
    importers = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "worker").rglob("*.py")
        if any(resolve(path, n) == "worker.tasks.app" for n in imported_modules(path))
    }
    # the task modules define tasks on the app; `reactq worker` starts it; worker/celery_app.py is the alias
    # `celery -A worker.celery_app` finds. Everyone else uses worker.names.
    assert importers == {"worker/tasks/steps.py", "worker/tasks/webhooks.py", "worker/cli/serve.py",
                         "worker/celery_app.py"}


def test_queue_names_are_written_nowhere_else_in_worker() -> None:
    for path in (ROOT / "worker").rglob("*.py"):
        if path.name == "names.py":
            continue
        text = Path(path).read_text()
        for name in (*names.QUEUES, names.SANDBOX_TASK):  # (STEP_TASK is also the step logger's name)
            assert f'"{name}"' not in text, f"{path.relative_to(ROOT)} spells out {name!r}; import worker.names"


def test_a_step_message_shows_its_arguments_as_saferepr_would() -> None:
    from celery.utils.saferepr import saferepr

    run_id = "0123456789abcdef0123456789abcdef"
    assert names.step_reprs(run_id, 7) == {"argsrepr": saferepr([run_id, 7]), "kwargsrepr": saferepr({})}
