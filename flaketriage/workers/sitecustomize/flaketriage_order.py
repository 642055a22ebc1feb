"""A pytest plugin for replays: run the collected tests in exactly the order given, repeats included.

The polluter search asks "does the test fail when it runs after these tests?", and one answer it
must be able to ask about is the test itself: a non-idempotent test fails on its second run in one
process. pytest runs a node id named twice on its command line once, so the order is handed over
in ``FLAKETRIAGE_TEST_ORDER`` (a JSON list of node ids as the rerun command names them, relative
to the directory pytest was started in) and this plugin, loaded through ``PYTEST_PLUGINS`` from the
replay's ``PYTHONPATH``, lays the collected items out in that order, an item as often as it is
named. Ids that were not collected are left out, as pytest leaves out what it cannot find. It
imports nothing but pytest and the standard library: the replayed environment may lack flaketriage.
"""

import json
import os

import pytest

ORDER_ENV = "FLAKETRIAGE_TEST_ORDER"


def _invocation_relative(nodeid, rootdir, invocation_dir):  # type: ignore[no-untyped-def]
    if rootdir == invocation_dir:
        return nodeid
    path, sep, rest = nodeid.partition("::")
    rel = os.path.relpath(os.path.join(rootdir, path), invocation_dir).replace(os.sep, "/")
    return rel + sep + rest


# Last, after plugins that reorder (pytest-randomly): the order given is the one that runs.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    raw = os.environ.get(ORDER_ENV)
    if not raw:
        return
    order = json.loads(raw)
    rootdir = str(config.rootpath)
    invocation_dir = str(config.invocation_params.dir)
    by_id = {}
    for item in items:
        by_id.setdefault(_invocation_relative(item.nodeid, rootdir, invocation_dir), item)
        by_id.setdefault(item.nodeid, item)
    items[:] = [by_id[nodeid] for nodeid in order if nodeid in by_id]
