"""``python -m minispec`` runs the command line."""

import sys

from minispec.cli import main

sys.exit(main())
