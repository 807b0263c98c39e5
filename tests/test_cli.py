"""The command line as a user meets it: exit codes, messages without tracebacks, printed IR."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import EXAMPLES, ROOT, gnnc_in_process as gnnc


def gnnc_process(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    """`python -m gnnc ARGS`: for what only a process shows (the rest runs in-process, 4 s of CPU less a call)."""
    return subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_check_ok() -> None:
    r = gnnc_process("check", str(EXAMPLES / "gat.gnn"))
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_check_error_exit_2_with_caret(tmp_path) -> None:
    bad = tmp_path / "bad.gnn"
    bad.write_text("layer L(in, out) {\n  transform t = linear(h, out)\n  apply h = reluu(t)\n}\n"
                   "model M(features, classes) {\n  h = L(features, classes)(x)\n"
                   "  loss = cross_entropy(h, y, mask = train)\n}\n")
    r = gnnc_process("check", str(bad))
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert lines[0] == f"{bad}:3:13: unknown op 'reluu'; did you mean 'relu'?"
    assert lines[1] == "    apply h = reluu(t)"
    assert lines[2] == "  " + " " * 12 + "^"
    assert "Traceback" not in r.stderr


def test_missing_file_exit_2(tmp_path) -> None:
    r = gnnc("check", str(tmp_path / "nope.gnn"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_unknown_set_exit_2() -> None:
    r = gnnc("check", str(EXAMPLES / "gcn.gnn"), "--set", "hiden=3")
    assert r.returncode == 2
    assert "has no parameter 'hiden'; did you mean 'hidden'?" in r.stderr


def test_compile_print_after_one_pass() -> None:
    r = gnnc("compile", str(EXAMPLES / "sage.gnn"), "--passes", "infer-shapes,check,lower",
             "--print-after", "lower")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("// ----- IR after lower -----\nprogram GraphSAGE(")
    assert "spmm[reduce=mean]" in r.stdout
    assert "gather[" not in r.stdout


def test_compile_prefix_pipeline_keeps_graph_ops() -> None:
    r = gnnc("compile", str(EXAMPLES / "sage.gnn"), "--passes", "infer-shapes", "--print-after", "infer-shapes")
    assert r.returncode == 0, r.stderr
    assert "gather[reduce=mean]" in r.stdout and "spmm" not in r.stdout


def test_unknown_pass_exit_2() -> None:
    r = gnnc("compile", str(EXAMPLES / "sage.gnn"), "--passes", "infer-shapes,lowr")
    assert r.returncode == 2 and "unknown pass 'lowr'" in r.stderr


def test_plan_round_trip_and_inspect(tmp_path) -> None:
    out = tmp_path / "plan"
    r = gnnc("compile", str(EXAMPLES / "gcn.gnn"), "-o", str(out), "--set", "hidden=32", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["strategies"] == ["local", "local"]
    r = gnnc("inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert "GCNConv" in r.stdout and "linear0.weight[features, hidden]" in r.stdout
    r = gnnc("inspect", str(out), "--format", "dot")
    assert r.stdout.startswith("digraph plan {")
    plan = json.loads((out / "plan.json").read_text())
    plan["ir_sha256"] = "0" * 64
    (out / "plan.json").write_text(json.dumps(plan))
    r = gnnc("inspect", str(out))
    assert r.returncode == 2 and "does not match its checksum" in r.stderr


def test_compile_is_deterministic(tmp_path) -> None:
    # each plan compiled in this process and in a fresh one (another hash seed, so no order may come from a set);
    # the fresh process compiles both, as `python -m gnnc` would, to start one interpreter instead of two
    gat = ["compile", str(EXAMPLES / "gat.gnn"), "-o"]
    cora = ["compile", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--workers", "2", "--strategy", "hybrid",
            "-o"]  # a distributed plan: its partition and every rank's shard too
    script = "import json, sys\nfrom gnnc.cli import main\nfor args in json.loads(sys.argv[1]):\n" \
             "    if code := main(args):\n        sys.exit(code)\n"
    both = json.dumps([gat + [str(tmp_path / "b")], cora + [str(tmp_path / "c")]])
    r = subprocess.run([sys.executable, "-c", script, both], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    for args, d in ((gat, "a"), (cora, "d")):
        r = gnnc(*args, str(tmp_path / d))
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "a" / "plan.json").read_bytes() == (tmp_path / "b" / "plan.json").read_bytes()
    files = sorted(p.relative_to(tmp_path / "c") for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert len(files) == 5  # plan.json, parts.npy, the manifest and two shards
    for f in files:
        assert (tmp_path / "c" / f).read_bytes() == (tmp_path / "d" / f).read_bytes(), f


def test_passes_listed() -> None:
    r = gnnc("passes")
    assert r.returncode == 0
    for name in ("infer-shapes", "check", "lower"):
        assert name in r.stdout


def test_run_summary_folds_repeated_strategies() -> None:
    from gnnc.plan.strategies import describe_assignment

    assert describe_assignment(["depcache"] * 64) == "depcache x64"
    assert describe_assignment(["pushpull", "depcomm", "depcomm"]) == "pushpull,depcomm x2"
    assert describe_assignment(["depcomm", "bcast1d", "depcomm"]) == "depcomm,bcast1d,depcomm"


def test_a_pass_run_without_what_it_requires_exits_2() -> None:
    r = gnnc("compile", str(EXAMPLES / "gcn.gnn"), "--passes", "insert-comm")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("pass 'insert-comm' requires that graph layers carry a strategy attribute, which does not hold "
            "(it runs first): run assign-strategy before it") in r.stderr


def test_pass_options_on_the_cli(tmp_path) -> None:
    r = gnnc("compile", str(EXAMPLES / "gcn.gnn"), "--passes", "infer-shapes,choose-strategy{allow=depcomm,nope")
    assert r.returncode == 2 and "'{' without '}'" in r.stderr
    r = gnnc("compile", str(EXAMPLES / "gcn.gnn"), "--passes", "infer-shapes,check{x=1}")
    assert r.returncode == 2 and "pass 'check' takes no options" in r.stderr
    r = gnnc("compile", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--workers", "2", "--json",
             "--passes", "infer-shapes,check,lower,choose-strategy{allow=depcache},assign-strategy,insert-comm")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["strategies"] == ["depcache", "depcache"]
    assert "choose-strategy{allow=depcache}" in summary["passes"]
    listed = gnnc("passes").stdout
    assert "allow=<empty> (list of str): strategies the planner may choose" in listed
    assert "requires: graph layers carry a strategy attribute" in listed


def test_partition_choices_come_from_the_registry() -> None:
    from gnnc.cli import build_parser
    from gnnc.passes.partition import METHODS

    compile_parser = build_parser()._subparsers._group_actions[0].choices["compile"]
    [action] = [a for a in compile_parser._actions if a.dest == "partition"]
    assert list(action.choices) == list(METHODS)


def test_compile_help_states_the_default_pipeline() -> None:
    from gnnc.cli import build_parser
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE

    compile_parser = build_parser()._subparsers._group_actions[0].choices["compile"]
    text = " ".join(compile_parser.format_help().split())  # argparse wraps at hyphens: undo the line breaks
    text = text.replace("- ", "-")
    assert f"default: {','.join(DEFAULT_PIPELINE)}" in text
    assert f"--workers N>1 by {','.join(DISTRIBUTED_PIPELINE)}" in text


def test_every_training_setting_is_documented() -> None:
    from gnnc.frontend.elaborate import TRAINING_KEYS

    language = (ROOT / "docs" / "language.md").read_text()
    item = language.split("- `training(", 1)[1].split("\n- ", 1)[0]  # the list item that describes training(...)
    signature = item.split(")`", 1)[0]
    for key in TRAINING_KEYS:
        assert f"{key}=" in signature, f"docs/language.md: training(...) does not list '{key}'"
        if key not in ("epochs", "lr", "weight_decay"):  # the others need a word on what they do
            assert f"`{key}" in item.split(")`", 1)[1], f"docs/language.md does not say what '{key}' does"


TWO_MODELS = """layer L(in, out) {
  apply h = linear(h, out)
}
model A(features, classes) {
  h = L(features, classes)(xx)
  loss = cross_entropy(h, y, mask = train)
}
model B(features, classes, hidden = 4) {
  h = L(features, classes)(x)
  loss = cross_entropy(h, y, mask = train)
}
"""


def test_check_checks_every_model_and_model_picks_one(tmp_path, capsys) -> None:
    """An error in an earlier model is reported (issue 21, item 5); --model NAME checks, compiles, runs NAME."""
    from gnnc import cli

    path = tmp_path / "two.gnn"
    path.write_text(TWO_MODELS)
    r = gnnc("check", str(path))
    assert r.returncode == 2 and r.stderr.startswith(f"{path}:5:28: unknown name 'xx'; did you mean 'x'?")
    assert "Traceback" not in r.stderr
    assert cli.main(["check", str(path), "--model", "B", "--set", "hidden=8"]) == 0
    path.write_text(TWO_MODELS.replace("(xx)", "(x)"))
    capsys.readouterr()
    assert cli.main(["check", str(path), "--set", "hidden=8"]) == 0  # applies to the models that declare it
    assert capsys.readouterr().out.strip() == f"{path}: ok (2 models: A, B)"
    assert cli.main(["compile", str(path), "--model", "A", "--passes", "infer-shapes", "--print-after",
                     "infer-shapes"]) == 0
    assert "program A(" in capsys.readouterr().out
    assert cli.main(["run", str(path), "--model", "C", "--graph", "planetoid:cora"]) == 2
    err = capsys.readouterr().err
    assert "no model named 'C'" in err and "(its models: A, B)" in err
