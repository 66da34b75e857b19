"""maxit's command line (`maxit ...`). It sits outside `pipeline/`, which never imports Dagster,
because `maxit run` and `maxit ui` drive the Dagster definitions in `assets/`."""
