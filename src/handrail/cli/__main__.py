"""`python -m handrail.cli`."""

import sys

from handrail.cli import main

sys.exit(main())
