import dagster as dg


def test_definitions_load():
    from assets.definitions import defs

    assert isinstance(defs, dg.Definitions)
    defs.resolve_all_job_defs()
