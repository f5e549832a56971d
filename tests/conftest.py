import os

# jsii prints a banner about Node 20's end of life on every start; the CI machine runs Node 20, so it is noise here.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


# The test files that take longest (a session's synthesis and local deploy, real worker processes killed mid-run),
# run first: whole files go to the workers (pytest-xdist's loadfile) in collection order, so starting the long ones
# first keeps one worker from finishing a long file alone at the end.
SLOW_FIRST = (
    "tests/examples/test_local_deploy.py",
    "tests/runtime/test_batch_worker_reliability.py",
    "tests/examples/test_gates.py",
    "tests/fleets/test_preprocessing.py",
    "tests/runtime/test_batch_pipeline_end_to_end.py",
    "tests/runtime/test_preprocess_worker.py",
    "tests/test_readme.py",
)


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    def rank(item: object) -> int:
        path = str(getattr(item, "nodeid", "")).split("::", 1)[0]
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within and among the other files is kept
