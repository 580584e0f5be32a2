"""Run every benchmark in benchmarks/, one after another, each in its own process.

The paper reproduction (DIGITS sweep, Fashion-MNIST table, peers) and the
performance benchmarks (the overhead of the penalties, of the monitor, of
proximal training and on a CNN, all from ``overhead.py``; the cost of one
compiled training step, ``step_cost.py``; proximal training; inference of
pruned models and its batch-1 latency floor; the scikit-learn path), whichever
of them exist. ``--quick`` is passed on to the scripts that
accept it; ``--seeds`` to the paper-reproduction scripts.

Usage:
    KERAS_BACKEND=jax python benchmarks/run_all.py --seeds 3
    python benchmarks/run_all.py --quick
    python benchmarks/run_all.py --only digits peers
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __package__ in (None, ""):
    sys.path.insert(0, str(HERE.parent))

from benchmarks.common import positive_int  # noqa: E402

# name -> (script, takes --seeds[, leading arguments])
BENCHMARKS = {
    "digits": ("digits_sweep.py", True),
    "fashion-mnist": ("fashion_table.py", True),
    "peers": ("peers_digits.py", True),
    "penalty-overhead": ("overhead.py", False, ("penalty",)),
    "monitor-overhead": ("overhead.py", False, ("monitor",)),
    "proximal": ("proximal_digits.py", False),
    "proximal-overhead": ("overhead.py", False, ("proximal",)),
    "cnn-overhead": ("overhead.py", False, ("cnn",)),
    "inference": ("inference.py", False),
    "inference-latency": ("inference_latency.py", False),
    "step-cost": ("step_cost.py", False),
    "sklearn-path": ("sklearn_path.py", False),
    "sklearn-cv": ("sklearn_cv.py", True),
    "budget": ("budget.py", True),
    "cnn": ("cnn_fashion.py", True),
    "resnet": ("resnet_fashion.py", False),
}


def _accepts(script, flag):
    return f'add_argument("{flag}"' in script.read_text()


def command_for(name, quick=False, seeds=None):
    """The argv that runs benchmark ``name``, or None when its script is not there."""
    filename, takes_seeds, *leading = BENCHMARKS[name]
    script = HERE / filename
    if not script.exists():
        return None
    argv = [sys.executable, str(script), *(leading[0] if leading else ())]
    if quick and _accepts(script, "--quick"):
        argv.append("--quick")
    if seeds is not None and takes_seeds and not quick:
        argv += ["--seeds", str(seeds)]
    return argv


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=None, help="seeds for the paper-reproduction benchmarks")
    parser.add_argument("--quick", action="store_true", help="smoke runs (scripts without --quick run as they are)")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    args = parser.parse_args(argv)

    failed = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in args.only or BENCHMARKS:
        command = command_for(name, args.quick, args.seeds)
        if command is None:
            print(f"== {name}: {BENCHMARKS[name][0]} not found, skipped", flush=True)
            continue
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        status = subprocess.call(command, cwd=HERE.parent, env=env)
        print(f"== {name}: exit {status} after {(time.perf_counter() - start) / 60:.1f} min", flush=True)
        if status:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
