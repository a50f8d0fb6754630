"""`python -m cadence.sim`: the policy comparison (see cadence.sim.cli)."""

import sys

from cadence.sim.cli import main

sys.exit(main())
