"""``python -m minispec`` runs the command line."""

import sys

from minispec.tools.cli import main

sys.exit(main())
