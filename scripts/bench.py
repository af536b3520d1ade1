"""Every benchmark of minigpt: `python scripts/bench.py [--nanogpt DIR] [--quick] [--only PART] ...`
(`--help` lists the options; scripts/benchmarks/__init__.py says what each part measures).

This file is only the entry point: the benchmarks are the package scripts/benchmarks/, one module
per benchmark, and its runner (benchmarks/runner.py) is what runs here. The package is not named
`bench` because beside it this script could no longer be imported by name (`import bench` finds the
package). Run as a script, Python puts scripts/ first on the path; loaded by its path (as
tests/test_bench.py loads it), it puts it there itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks.runner import main  # noqa: E402

if __name__ == "__main__":
    main()
