"""``python -m pytest_simplefsdp.report``: the report tool (tool.py)."""

import sys

from .tool import main

sys.exit(main())
