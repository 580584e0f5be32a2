"""How long surgery takes on a full-size network: ``prune_model`` of ResNet50 at 224x224, 1000 classes.

The model is ``keras.applications.ResNet50(weights=None)`` (25.6 M parameters),
with random BatchNormalization statistics and half of the output channels of
the first two convolutions of every bottleneck set to zero (the channels a
trained network with group penalties would lose). Timed on the backend the
script runs on (``KERAS_BACKEND``):

* ``plan``: :func:`keras_group_lasso.plan_pruning` (graph, masks, report, plan:
  everything but building layers);
* ``prune``: :func:`keras_group_lasso.prune_model` (plan + the new model with
  its weights); the first call apart (JAX traces, TensorFlow builds its
  kernels), then the median and range of ``--repeats`` more.

Each time is wall time (``time.perf_counter``) and the process's CPU time. The
pruned model is checked against the thresholded original on two images.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/surgery_speed.py --out   # -> benchmarks/results/surgery_speed_<backend>.md
    KERAS_BACKEND=jax python benchmarks/surgery_speed.py                # -> benchmarks/out/surgery_speed_<backend>.md
    python benchmarks/surgery_speed.py --quick                          # 2 timed calls -> benchmarks/out/
"""

import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402


def sparsified_resnet50(rng):
    """ResNet50 (224x224, 1000 classes) with half the channels of each bottleneck's first two convolutions dead."""
    import keras

    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000,
                                        classifier_activation=None)
    names = {layer.name for layer in model.layers}
    dropped = 0
    for name in sorted(names):
        if re.fullmatch(r"conv\d_block\d+_[12]_conv", name):
            layer = model.get_layer(name)
            kernel, bias = layer.get_weights()
            channels = kernel.shape[-1]
            dead = rng.permutation(channels)[: channels // 2]
            kernel[..., dead] = 0.0
            layer.set_weights([kernel, bias])
            dropped += dead.size
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 1.5, variance.shape)])
    return model, dropped


def timed(function):
    """``(result, wall seconds, CPU seconds)`` of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


QUICK = "2 timed calls after the first; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--repeats", type=common.positive_int, default=5, help="timed calls after the first (default 5)")
    parser.add_argument("--out", action="store_true",
                        help="write to benchmarks/results/ (default benchmarks/out/, as with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 2

    import keras

    from keras_group_lasso import apply_threshold, plan_pruning, prune_model

    backend = keras.backend.backend()
    run = common.Run(f"surgery_speed_{backend}", args)
    if not args.out:
        run.out = common.HERE / "out"
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    model, dropped = sparsified_resnet50(rng)
    common.say(f"ResNet50 224x224: {model.count_params():,} parameters, {dropped} channels zeroed")

    small, first_wall, first_cpu = timed(lambda: prune_model(model))
    prunes = [timed(lambda: prune_model(model))[1:] for _ in range(args.repeats)]
    plans = [timed(lambda: plan_pruning(model))[1:] for _ in range(args.repeats)]

    x = rng.uniform(0, 255, size=(2, 224, 224, 3)).astype("float32")
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    apply_threshold(reference)
    want = np.asarray(keras.ops.convert_to_numpy(reference(x, training=False)), np.float64)
    got = np.asarray(keras.ops.convert_to_numpy(small(x, training=False)), np.float64)
    diff = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
    if diff > 1e-4:
        raise SystemExit(f"surgery_speed: the pruned model differs from the thresholded one by {diff:.1e} "
                         "of the output scale (more than 1e-4)")

    def summary(pairs):
        walls, cpus = [p[0] for p in pairs], [p[1] for p in pairs]
        return {"wall_median": statistics.median(walls), "wall_min": min(walls), "wall_max": max(walls),
                "cpu_median": statistics.median(cpus)}

    prune, plan = summary(prunes), summary(plans)
    rows = [
        ["`prune_model`, first call", f"{first_wall:.2f}", "-", f"{first_cpu:.2f}"],
        [f"`prune_model`, median of {args.repeats}", f"{prune['wall_median']:.2f}",
         f"{prune['wall_min']:.2f}-{prune['wall_max']:.2f}", f"{prune['cpu_median']:.2f}"],
        [f"`plan_pruning`, median of {args.repeats}", f"{plan['wall_median']:.2f}",
         f"{plan['wall_min']:.2f}-{plan['wall_max']:.2f}", f"{plan['cpu_median']:.2f}"],
    ]
    params_before, params_after = int(model.count_params()), int(small.count_params())
    notes = [
        f"Model: ResNet50, weights=None, 1000 classes, {params_before:,} parameters; "
        f"{dropped} channels of the bottlenecks' first two convolutions zeroed -> "
        f"{params_after:,} parameters after surgery",
        f"Pruned vs thresholded original on 2 images: max difference {diff:.1e} of the output scale",
    ]
    records = ([{"call": "prune_model", "first": True, "wall": first_wall, "cpu": first_cpu}]
               + [{"call": "prune_model", "first": False, "wall": w, "cpu": c} for w, c in prunes]
               + [{"call": "plan_pruning", "first": False, "wall": w, "cpu": c} for w, c in plans])
    run.publish(f"Surgery speed: ResNet50 224x224 ({backend})",
                common.markdown_table(["call", "wall [s]", "range [s]", "CPU [s]"], rows), records, notes=notes,
                section=False, params_before=params_before, params_after=params_after, channels_zeroed=dropped,
                first_prune={"wall": first_wall, "cpu": first_cpu}, prune=prune, plan=plan, max_relative_diff=diff)
    return 0


if __name__ == "__main__":
    sys.exit(main())
