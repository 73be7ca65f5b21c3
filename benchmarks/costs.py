"""Step time, roofline, r(k) and start-up of the eager and the fast forward, side by side.

The same as ``minispec bench costs``; see ``minispec.costs``. Examples::

    python benchmarks/costs.py --threads 1                      # random-weight SmolLM2-135M shape
    python benchmarks/costs.py --target shakespeare-target --draft shakespeare-draft
"""

import sys

from minispec.costs import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
