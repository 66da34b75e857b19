"""`python -m pipeline.learn.trainer`: one training run as its own process (`process.main`)."""

from pipeline.learn.trainer.process import main

raise SystemExit(main())
