"""`python -m gnnc ...` (and `torchrun -m gnnc run PLAN`) runs the CLI."""
import sys

from gnnc.cli import main

code = main()
launch = sys.modules.get("gnnc.runtime.launch")  # loaded only by the commands that run workers
if launch is not None and launch.started_by_torchrun():
    launch.end_joined_rank(code)
sys.exit(code)
