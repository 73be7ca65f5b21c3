"""Step time, roofline, r(k), c and start-up of the eager and the fast forward, side by side.

The same command as ``minispec bench costs`` (alias ``minispec bench roofline``), with the same
options; see ``minispec.tools.costs``. Examples::

    python benchmarks/costs.py --threads 1 --clock cpu          # the shipped pair (the default)
    python benchmarks/costs.py --model smollm2-135m-instruct --threads 1 --clock cpu
    python benchmarks/costs.py --target random:smollm2-135m     # random weights, SmolLM2's shape
"""

import sys

from minispec.tools.costs import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="benchmarks/costs.py"))
