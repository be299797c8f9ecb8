"""``python -m rlexp.report <sweep dir>``: see ``rlexp.report.main``."""

import sys

from rlexp.report.main import main

sys.exit(main())
