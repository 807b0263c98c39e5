"""`python -m gnnc ...` (and `torchrun -m gnnc run PLAN`) runs the CLI."""
import sys

from gnnc.cli import main

sys.exit(main())
