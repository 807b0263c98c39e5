"""`gnnc.run(..., nproc=N)` called from a script (issue 21, item 11).

A script that starts workers without
`if __name__ == "__main__":` is refused before any worker starts, naming its
line (a 'spawn' worker imports the main script again, so the unguarded call
would run in every worker); a worker that dies while being set up, before
gnnc's code runs, is reported as such, not as a bare "exited with status 1".
(That `gnnc.run` returns one RunResult for one process and for N is pinned
by tests/test_api_cli_agree.py, which runs both.)
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

HELPER = "def rank_of(cfg):\n    return cfg.rank\n"


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "helper.py").write_text(HELPER)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_a_script_without_the_main_guard_is_refused_naming_its_line(tmp_path) -> None:
    r = _script(tmp_path, """\
        from gnnc.runtime.launch import launch
        from helper import rank_of
        print(launch(rank_of, 2))
    """)
    assert r.returncode != 0
    assert f"{tmp_path / 'job.py'}:3: this line starts 2 worker processes" in r.stderr, r.stderr
    assert 'if __name__ == "__main__":' in r.stderr and "exited with status" not in r.stderr


def test_a_worker_that_dies_while_starting_is_reported_as_such(tmp_path) -> None:
    # guarded, so the launch goes ahead; each worker then fails as it imports the script again
    r = _script(tmp_path, """\
        import sys
        if __name__ == "__mp_main__":
            sys.exit(3)
        from gnnc.runtime.launch import launch
        from helper import rank_of
        if __name__ == "__main__":
            print(launch(rank_of, 2))
    """)
    assert r.returncode != 0
    assert "exited with status 3 before gnnc's worker code started" in r.stderr, r.stderr
    assert 'if __name__ == "__main__":' in r.stderr


def test_guarded_and_interactive_callers_are_not_refused(tmp_path) -> None:
    from gnnc.runtime.main_guard import unguarded_main_call

    assert unguarded_main_call() is None  # pytest's main module is guarded (or a package's __main__)
    code = "from gnnc.runtime.main_guard import unguarded_main_call\nprint(unguarded_main_call())\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.stdout.strip() == "None", r.stderr  # python -c: spawn runs nothing again
    r = _script(tmp_path, """\
        from gnnc.runtime.main_guard import unguarded_main_call


        def main():
            return unguarded_main_call()


        if __name__ == "__main__":
            print(main())
        print(unguarded_main_call())
    """)
    assert r.stdout.split() == ["None", f"('{tmp_path / 'job.py'}',", "10)"], r.stdout + r.stderr
