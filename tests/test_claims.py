"""The README's numbers come from committed results: every number in its marked fair-comparison block is printed
by the recompute script (testbed/fair.py) from the per-seed records alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = re.compile(r"\d+\.\d+")


def test_every_number_of_the_readmes_fair_comparison_is_printed_by_the_recompute_script():
    with open(os.path.join(REPO, "README.md")) as fh:
        readme = fh.read()
    block = re.search(r"<!-- fair\.py:.*?-->(.*?)<!-- /fair\.py -->", readme, re.S)
    assert block, "the README's fair-comparison block (<!-- fair.py: ... --> ... <!-- /fair.py -->) is missing"
    quoted = set(NUMBER.findall(block.group(1)))
    assert len(quoted) >= 20, quoted
    printed = subprocess.run([sys.executable, os.path.join(REPO, "testbed", "fair.py")], capture_output=True,
                             text=True, check=True, cwd=REPO).stdout
    missing = sorted(n for n in quoted if n not in set(NUMBER.findall(printed)))
    assert not missing, f"README numbers testbed/fair.py does not print: {missing}"
