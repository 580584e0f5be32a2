"""Run every benchmark in benchmarks/, one after another, each in its own process.

The paper reproduction (DIGITS sweep, Fashion-MNIST table, peers), the performance benchmarks (the overhead of
the penalties, of the monitor, of proximal training and on a CNN; one compiled training step; inference of pruned
models; the scikit-learn path) and the experiments after them (budgets on CNNs, KerasHub models, latency,
deployment, sequences, the peers on a CNN): every script on the harness (``common.arguments``), so each takes
``--quick``; ``--seeds`` goes to those that train on seeds. The scripts in :data:`APART` take arguments of their
own and run on their own. A full run of everything takes many hours on 2 cores.

Usage:
    KERAS_BACKEND=jax python benchmarks/run_all.py --seeds 3
    python benchmarks/run_all.py --quick
    python benchmarks/run_all.py --only digits peers
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __package__ in (None, ""):
    sys.path.insert(0, str(HERE.parent))

from benchmarks.common import positive_int  # noqa: E402

# name -> (script[, leading arguments]); each takes --quick (the harness), and --seeds where it trains on seeds
BENCHMARKS = {
    "digits": ("digits_sweep.py",),
    "fashion-mnist": ("fashion_table.py",),
    "peers": ("peers_digits.py",),
    "penalty-overhead": ("overhead.py", ("penalty",)),
    "monitor-overhead": ("overhead.py", ("monitor",)),
    "proximal": ("proximal_digits.py",),
    "proximal-recurrent": ("proximal_recurrent.py",),
    "proximal-overhead": ("overhead.py", ("proximal",)),
    "cnn-overhead": ("overhead.py", ("cnn",)),
    "inference": ("inference.py",),
    "inference-latency": ("inference_latency.py",),
    "step-cost": ("step_cost.py",),
    "sklearn-path": ("sklearn_path.py",),
    "sklearn-cv": ("sklearn_cv.py",),
    "budget": ("budget.py",),
    "budget-cost": ("budget_cost.py",),
    "cnn": ("cnn_fashion.py",),
    "resnet": ("resnet_fashion.py",),
    "keras-hub-resnet": ("keras_hub_resnet.py",),
    "xception": ("xception_budget.py",),
    "peers-cnn": ("peers_cnn.py",),
    "modern-cnn": ("modern_cnn.py",),
    "latency-budget": ("latency_budget.py",),
    "latency-modern": ("latency_modern.py",),
    "deploy": ("deploy.py",),
    "round-to": ("round_to.py",),
    "conv-widths": ("conv_widths.py",),
    "surgery-speed": ("surgery_speed.py",),
    "tabular": ("tabular.py",),
    "sequences": ("sequences.py",),
    "text-transformer": ("text_transformer.py",),
    "vit": ("vit_fashion.py",),
    "gemma-lm": ("gemma_lm.py",),
}
#: Scripts run on their own, with the arguments RESULTS.md gives them: why not in ``BENCHMARKS``.
APART = {
    "cnn_inference.py": "times the pruned structures it is given (--keep)",
    "cnn_scratch.py": "trains the structures it is given (--structure)",
    "gpu_checks.py": "the checks for a GPU machine",
}


def _accepts(script, flag):
    """Whether ``script`` takes ``flag``: every script on the harness (``common.arguments``) takes ``--quick``,
    and ``--seeds`` where it passes ``seeds=``."""
    text = script.read_text()
    harness = re.search(r"common\.arguments\(([^)]*)\)", text)
    if harness and (flag == "--quick" or (flag == "--seeds" and "seeds=" in harness.group(1))):
        return True
    return f'add_argument("{flag}"' in text


def command_for(name, quick=False, seeds=None):
    """The argv that runs benchmark ``name``, or None when its script is not there."""
    filename, *leading = BENCHMARKS[name]
    script = HERE / filename
    if not script.exists():
        return None
    argv = [sys.executable, str(script), *(leading[0] if leading else ())]
    if quick and _accepts(script, "--quick"):
        argv.append("--quick")
    if seeds is not None and not quick and _accepts(script, "--seeds"):
        argv += ["--seeds", str(seeds)]
    return argv


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=None, help="seeds for the benchmarks that train on seeds")
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
