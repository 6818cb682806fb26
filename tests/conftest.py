"""Test ordering for the parallel run (pytest-xdist, `-n auto --dist loadfile`).

Each module runs whole on one worker, in collection order. The modules that analyse the whole fixture
corpus in a single test take minutes each; collected last, they left one worker busy long after the
other had finished. Collected first, they start at once and the rest of the suite fills the other
worker around them.
"""

CORPUS_WIDE = ("test_golden.py", "test_accuracy.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in CORPUS_WIDE)  # stable: every other order is kept
