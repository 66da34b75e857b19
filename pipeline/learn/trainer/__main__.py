"""`python -m pipeline.learn.trainer`: one training run as its own process (`process.main`)."""

import os

from pipeline.store.lifeline import hold_lifeline

# first, before torch loads: a trainer (or a torchrun rank) whose run is gone must not write its checkpoint
hold_lifeline("trainer" if "RANK" not in os.environ else f"trainer rank {os.environ['RANK']}")

from pipeline.learn.trainer.process import main  # noqa: E402

raise SystemExit(main())
