"""Runs every benchmark (bench/bench_*.py) in turn; each one prints its table and updates bench/RESULTS.md."""

import subprocess
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
failed = []
for script in sorted(here.glob("bench_*.py")):
    print(f"=== {script.name}", flush=True)
    if subprocess.run([sys.executable, str(script)], cwd=here).returncode != 0:
        failed.append(script.name)
if failed:
    sys.exit(f"benchmarks failed: {', '.join(failed)}")
