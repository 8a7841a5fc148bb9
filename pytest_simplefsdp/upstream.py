"""``python -m pytest_simplefsdp.upstream``: the coverage report's first command, kept working (the report itself is
report/coverage.py, and upstream's suite as a matrix source is spec/upstream.py)."""

import sys

from .report.coverage import main

if __name__ == "__main__":
    sys.exit(main())
