"""A python session's program: the run's earlier cells replayed, quietly and in order, then the new cell.

A session's state is rebuilt, never kept: each execution starts clean (a warm container holds nothing of an
earlier execution), so the variables of earlier cells exist because their code runs again first. The cells
are the run's own recorded calls, sent with the request (ExecuteRequest.session), so the state outlives any
container, sandbox worker or host, and cannot cross runs. What replay cannot rebuild (time, randomness,
files and connections a cell opened, whatever a cell read from outside) is in docs/decisions/python-sessions.md.

Bounds, per tier: at most `session_max_cells` earlier cells (more is refused before anything runs), and
`session_replay_s` for the replay: the rest is skipped and the program is told so, or, when a replayed cell
swallows the interruption, the execution ends half a second later with exit code 124 and a note saying why.
The tier's memory, CPU and wall time hold for the whole execution, replay included.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

NOTE = "[session]"


class SessionCell(BaseModel):
    """An earlier python call of the run: its code, and whether it failed when it first ran (its failure on
    replay is then expected, not news)."""

    model_config = ConfigDict(frozen=True)

    code: str
    failed: bool = False


def session_full_text(max_cells: int) -> str:
    return (f"this run's python session already holds {max_cells} cells, the most its tier replays; "
            "the code was not run. Put what you need into one cell that does not rely on earlier ones.")


# The wrapper's names start with __reactq_ and it runs in a function: the cells' namespace is a fresh dict
# holding only what the cells define. Replayed cells print into /dev/null; only the new cell's output is shown.
_PROGRAM = '''\
def __reactq_session(cells, source, replay_s):
    import os, signal, sys

    class ReplayTimeout(BaseException):
        pass

    def stop(signum, frame):
        if alarms:  # the cell swallowed the first: the execution ends here, saying why
            print("%s replaying cell %d took longer than %g s and it would not stop: nothing more was run"
                  % (NOTE, number, replay_s), file=out, flush=True)
            os._exit(124)
        alarms.append(signum)
        raise ReplayTimeout()

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    out, err = sys.stdout, sys.stderr
    number, alarms = 0, []
    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, replay_s, 0.5)  # once more half a second later, if a cell swallowed it
    try:
        with open(os.devnull, "w") as quiet:
            for number, (code, failed) in enumerate(cells, 1):
                sys.stdout = sys.stderr = quiet
                try:
                    exec(compile(code, "<cell %d>" % number, "exec"), namespace)
                except ReplayTimeout:
                    raise
                except SystemExit as exc:
                    if exc.code not in (None, 0) and not failed:
                        print("%s cell %d, replayed, exited with %r this time" % (NOTE, number, exc.code), file=out)
                except BaseException as exc:
                    if not failed:
                        print("%s cell %d, replayed, failed this time: %s: %s"
                              % (NOTE, number, type(exc).__name__, exc), file=out)
                finally:
                    sys.stdout, sys.stderr = out, err
    except ReplayTimeout:
        sys.stdout, sys.stderr = out, err
        print("%s replaying the earlier cells took longer than %g s: cells %d to %d were not replayed"
              % (NOTE, replay_s, number, len(cells)), file=out)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        exec(compile(source, "<cell %d>" % (len(cells) + 1), "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.exit(1)


'''


def session_program(cells: Sequence[SessionCell], code: str, replay_s: float) -> str:
    """The program one session execution runs: `cells` replayed (within `replay_s`), then `code` (alone, as
    any execution runs it, when there is nothing to replay)."""
    if not cells:
        return code
    cells_repr = repr([(c.code, c.failed) for c in cells])
    return f"{_PROGRAM}\nNOTE = {NOTE!r}\n__reactq_session({cells_repr}, {code!r}, {float(replay_s)!r})\n"
