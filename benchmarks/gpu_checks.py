"""GPU checks on the JAX and PyTorch backends: ResNet50 surgery, the training cost of Proximal, pruned-CNN inference.

Each check runs in its own process per backend (``KERAS_BACKEND=jax``, then
``torch``), so that a crash, an out-of-memory error or a time-out costs that
check alone; its error text is recorded instead of its numbers.

* ``resnet50``: ``keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000,
  classifier_activation=None)`` (logits: the strictest comparison) with random
  group sparsity: in every bottleneck block half of the output channels of the
  first two convolutions (their kernel slices, their biases and the input
  slices of the convolution that reads them) get weights below the threshold
  (``|w| <= 5e-4``, threshold ``1e-3``); the other biases and every
  BatchNormalization's statistics are random. Measured: ``prune_model`` time
  (first and second call), parameters and multiply-adds before and after, and
  the largest difference between the pruned model and the thresholded
  original (``apply_threshold`` on a copy) on 8 random images, inference mode,
  relative to the largest output, at the backend's default precision (TF32
  convolutions on recent GPUs) and in full float32.
* ``training``: the 784-400-300-100-10 ReLU MLP on 60,000 random 784-feature
  rows (Fashion-MNIST's shape), batch 400: ``Proximal(Adam)`` with the group
  penalties of ``add_group_sparsity`` (sparse group Lasso, 1e-4) against plain
  ``Adam`` with Keras L2 (1e-4) on every kernel and bias. After a compile epoch
  and a sizing epoch each, timed units of the same number of epochs (the
  faster variant's unit >= 1 s), interleaved over 7 rounds in alternating
  order; reported: median seconds per epoch and the ratio of medians.
* ``cnn``: the VGG-style CNN of the Fashion-MNIST benchmarks
  (``cnn_fashion.py --channels 32 64 128 --convs-per-stage 2``: two 3x3
  convolutions with BatchNormalization and ReLU per stage, max pooling after
  each stage, Dense 64, Dense 10; 28x28x1 inputs) with random group sparsity
  keeping 25 % of every convolution's channels, cut by ``prune_model``.
  Dense vs pruned at batch 1 and 256, through ``model.predict_on_batch`` and
  through a direct call on inputs already on the device (JAX: ``jax.jit`` of
  ``model.stateless_call``; PyTorch: ``model(x)`` under ``torch.no_grad``,
  synchronised); median over interleaved rounds after warm-up.

Usage::

    python benchmarks/gpu_checks.py --out results/         # both backends, full sizes, on one GPU
    python benchmarks/gpu_checks.py --quick --out quick/   # ResNet50 at 32x32, 2 rounds, small epochs (a CPU test)

Needs Keras with JAX and/or PyTorch (TensorFlow is not needed). Options:
``--backends jax torch``, ``--checks resnet50 training cnn``, ``--deadline``
(seconds for the whole run, 345 by default so that it ends within 6 min; a
check that would start after it is skipped). Each check of a full run also
has its own time limit per backend (ResNet50 150 s, training 75 s, CNN 60 s,
compilation included): a check stopped at its limit keeps what it had
measured. Writes ``OUT/gpu_checks.json`` and ``OUT/gpu_checks.md`` (``--out``,
default ``$OUT``, else benchmarks/results, benchmarks/out with ``--quick``;
``--out-name`` another name) after every check, so a run cut short keeps its
results. Nothing in the checks imports TensorFlow; each result records whether
it ended up imported (Keras probes for it where it is installed). The driver
process imports Keras only to write the results' machine line, on the first of
``--backends`` unless ``KERAS_BACKEND`` is set.
"""

import argparse
import collections
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks import common
from benchmarks.common import say

NAME = "gpu_checks"
TITLE = "GPU checks: ResNet50 surgery, Proximal training cost, pruned-CNN inference (JAX and PyTorch)"
CHECKS = ("resnet50", "training", "cnn")
BACKENDS = ("jax", "torch")
THRESHOLD = 1e-3
FACTOR = 1e-4
MLP = (784, 400, 300, 100, 10)
VGG = ((32, 32), (64, 64), (128, 128))  # channels of the convolutions, per stage
# Seconds each check may take per backend in a full run (compile included); a --quick run on a CPU is not capped.
CAPS = {"resnet50": 150, "training": 75, "cnn": 60}
DEADLINE = 345.0


# ----------------------------------------------------------------------------- helpers of the checks (child process)


def device_name():
    """The device Keras computes on, as the backend sees it."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {device.device_kind}"
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)}"
        return "cpu"
    return backend


def outputs(model, x):
    import keras
    import numpy as np

    return np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), dtype=np.float64)


class full_float32:
    """Context: float32 matmuls and convolutions without TF32 (JAX precision, PyTorch cuDNN/cuBLAS flags)."""

    def __enter__(self):
        import keras

        self.backend = keras.backend.backend()
        if self.backend == "jax":
            import jax

            self.context = getattr(jax, "default_matmul_precision", None)
            if self.context is not None:
                self.context = self.context("float32")
                self.context.__enter__()
            else:
                self.saved = jax.config.jax_default_matmul_precision
                jax.config.update("jax_default_matmul_precision", "float32")
        elif self.backend == "torch":
            import torch

            self.saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        return self

    def __exit__(self, *exc):
        if self.backend == "jax":
            if self.context is not None:
                self.context.__exit__(*exc)
            else:
                import jax

                jax.config.update("jax_default_matmul_precision", self.saved)
        elif self.backend == "torch":
            import torch

            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.saved
        return False


def random_statistics(model, rng):
    """Random BatchNormalization parameters and statistics (so that the dropped channels are not all-zero maps)."""
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 1.5, variance.shape)])


def drop_channels(model, pairs, keep, rng):
    """Random group sparsity: for each ``(producer, reader)`` of ``pairs`` (layer names), a random ``1 - keep`` of
    the producer's output channels get kernel slices and biases below the threshold, and so do the rows of the
    reader that read them (a convolution's input channels; a Dense layer after Flatten: every row of the channel).
    The kept channels get random biases. Returns ``{producer: channels dropped}``."""
    import keras
    import numpy as np

    def tiny(shape):
        return rng.uniform(-0.5 * THRESHOLD, 0.5 * THRESHOLD, shape)

    dropped = {}
    for producer_name, reader_name in pairs:
        producer, reader = model.get_layer(producer_name), model.get_layer(reader_name)
        kernel, bias = producer.get_weights()
        n = kernel.shape[-1]
        drop = np.sort(rng.permutation(n)[: n - max(1, round(keep * n))])
        kernel[..., drop] = tiny(kernel[..., drop].shape)
        bias[:] = rng.normal(0, 0.05, n)
        bias[drop] = tiny(len(drop))
        producer.set_weights([kernel, bias])
        weights = reader.get_weights()
        if isinstance(reader, keras.layers.Dense):
            rows = np.isin(np.arange(weights[0].shape[0]) % n, drop)  # Flatten of (..., n): channel c is rows c, n + c
            weights[0][rows, :] = tiny(weights[0][rows, :].shape)
        else:
            weights[0][..., drop, :] = tiny(weights[0][..., drop, :].shape)
        reader.set_weights(weights)
        dropped[producer_name] = len(drop)
    return dropped


def thresholded_copy(model):
    import keras

    from keras_group_lasso import apply_threshold

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    apply_threshold(copy, THRESHOLD)
    return copy


def relative_difference(got, want):
    import numpy as np

    scale = float(np.max(np.abs(want)))
    diff = float(np.max(np.abs(got - want)))
    return diff, scale, diff / max(scale, 1e-30)


# ----------------------------------------------------------------------------- check: ResNet50 surgery


def check_resnet50(quick):
    import re

    import keras
    import numpy as np

    from keras_group_lasso import prune_model

    size = 32 if quick else 224
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000,
                                        classifier_activation=None)
    build_s = time.perf_counter() - t0
    names = {layer.name for layer in model.layers}
    pairs = []
    for name in sorted(names):
        match = re.fullmatch(r"(conv\d_block\d+)_([12])_conv", name)
        if match:
            reader = f"{match.group(1)}_{int(match.group(2)) + 1}_conv"
            if reader in names:
                pairs.append((name, reader))
    random_statistics(model, rng)
    dropped = drop_channels(model, pairs, 0.5, rng)
    convs = sum(isinstance(layer, keras.layers.Conv2D) for layer in model.layers)
    result = {"input_size": size, "build_s": build_s, "convolutions": convs, "convolutions_sparsified": len(pairs),
              "channels_dropped": sum(dropped.values()), "params_before": model.count_params()}
    progress(result)
    say(f"ResNet50 {size}x{size} built in {build_s:.1f} s; {len(pairs)} of {convs} convolutions lose half their "
        "channels; prune_model ...")

    t0 = time.perf_counter()
    small = prune_model(model, THRESHOLD)
    result["prune_first_s"] = time.perf_counter() - t0
    report = small.pruning_report
    result.update(params_after=small.count_params(), report_params_before=report.params_before,
                  report_params_after=report.params_after, flops_before=report.flops_before,
                  flops_after=report.flops_after)
    progress(result)
    t0 = time.perf_counter()
    again = prune_model(model, THRESHOLD)
    result["prune_second_s"] = time.perf_counter() - t0
    del again
    progress(result)
    say(f"prune_model: {result['prune_first_s']:.2f} s, then {result['prune_second_s']:.2f} s; comparing with the "
        "thresholded original ...")

    reference = thresholded_copy(model)
    x = rng.normal(size=(8, size, size, 3)).astype("float32")
    t0 = time.perf_counter()
    want = outputs(reference, x)
    diff, scale, rel = relative_difference(outputs(small, x), want)
    result.update(max_abs_diff=diff, output_scale=scale, relative_diff=rel,
                  forward_s_first_calls=time.perf_counter() - t0)
    progress(result)
    say(f"default precision: largest difference {diff:.3g} of {scale:.3g} ({rel:.2g}); again in full float32 ...")
    with full_float32():
        diff32, scale32, rel32 = relative_difference(outputs(small, x), outputs(reference, x))
    result.update(max_abs_diff_float32=diff32, output_scale_float32=scale32, relative_diff_float32=rel32,
                  exact_1e_5_float32=rel32 <= 1e-5)
    progress(result)
    result["relative_diff_unthresholded_vs_thresholded"] = relative_difference(outputs(model, x), want)[2]
    summary = (f"{size}px; prune {result['prune_first_s']:.1f}s/{result['prune_second_s']:.1f}s; params "
               f"{model.count_params() / 1e6:.2f}M->{small.count_params() / 1e6:.2f}M; rel diff {rel:.1e} "
               f"(fp32 {rel32:.1e})")
    return result, summary


# ----------------------------------------------------------------------------- check: training overhead


def mlp(penalty):
    import keras

    from keras_group_lasso import add_group_sparsity

    keras.utils.set_random_seed(0)

    def reg():
        return keras.regularizers.L2(FACTOR) if penalty == "l2" else None

    layers = [keras.Input((MLP[0],))]
    for units in MLP[1:-1]:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg(), bias_regularizer=reg()))
    layers.append(keras.layers.Dense(MLP[-1], activation="softmax", kernel_regularizer=reg(), bias_regularizer=reg()))
    model = keras.Sequential(layers)
    if penalty == "sgl":
        model = add_group_sparsity(model, FACTOR, penalty="sgl", bias=True)
    return model


def check_training(quick):
    import keras
    import numpy as np

    from keras_group_lasso import Proximal

    samples, rounds, min_seconds, batch = (4000, 2, 0.2, 400) if quick else (60000, 7, 1.0, 400)
    rng = np.random.default_rng(0)
    x = rng.random((samples, MLP[0]), dtype=np.float32)
    y = rng.integers(0, MLP[-1], samples)

    variants = {}
    plain = mlp("l2")
    plain.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    variants["Adam + L2"] = plain
    grouped = mlp("sgl")
    grouped.compile(optimizer=Proximal(keras.optimizers.Adam(1e-3)), loss="sparse_categorical_crossentropy")
    variants["Proximal(Adam) + group penalties"] = grouped

    losses = {}

    def fit(name, epochs):
        t0 = time.perf_counter()
        history = variants[name].fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False)
        losses[name] = float(history.history["loss"][-1])
        return time.perf_counter() - t0

    compile_s, sizing = {}, {}
    for name in variants:
        compile_s[name] = fit(name, 1)
        sizing[name] = fit(name, 1)
    epochs = max(1, math.ceil(min_seconds / max(min(sizing.values()), 1e-9)))
    say(f"training: first epochs {', '.join(f'{k} {v:.1f}s' for k, v in compile_s.items())}; "
        f"{epochs} epochs per timed unit, {rounds} rounds")
    names = list(variants)
    per_epoch = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            per_epoch[name].append(fit(name, epochs) / epochs)
        say(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.3f} s/epoch" for n, v in per_epoch.items()))
        progress({"samples": samples, "epochs_per_unit": epochs, "first_epoch_s": compile_s,
                  "seconds_per_epoch": per_epoch})
    reference, proximal = names
    medians = {name: statistics.median(v) for name, v in per_epoch.items()}
    paired = [p / q for p, q in zip(per_epoch[proximal], per_epoch[reference])]
    ratio = medians[proximal] / medians[reference]
    result = {
        "samples": samples,
        "batch": batch,
        "steps_per_epoch": math.ceil(samples / batch),
        "epochs_per_unit": epochs,
        "rounds": rounds,
        "jit_compile": {name: getattr(model, "jit_compile", None) for name, model in variants.items()},
        "first_epoch_s": compile_s,
        "seconds_per_epoch": per_epoch,
        "median_seconds_per_epoch": medians,
        "median_wall_ratio": ratio,
        "median_of_paired_ratios": statistics.median(paired),
        "last_loss": losses,
    }
    summary = (f"{samples} rows, {epochs} ep/unit x {rounds}; s/epoch L2 {medians[reference]:.3f} prox "
               f"{medians[proximal]:.3f}; ratio {ratio:.3f}")
    return result, summary


# ----------------------------------------------------------------------------- check: pruned CNN inference


def vgg(seed):
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    stack, k = [keras.Input((28, 28, 1))], 0
    for s, stage in enumerate(VGG, start=1):
        for count in stage:
            k += 1
            stack += [layers.Conv2D(count, 3, padding="same", name=f"conv{k}"),
                      layers.BatchNormalization(name=f"bn{k}"), layers.ReLU(name=f"relu{k}")]
        stack.append(layers.MaxPooling2D(name=f"pool{s}"))
    return keras.Sequential([*stack, layers.Flatten(name="flatten"), layers.Dense(64, activation="relu", name="dense"),
                             layers.Dense(10, name="logits")], name="cnn")


def direct_call(model, x):
    """A no-argument function: ``model`` on ``x`` already on the device, waited for."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        fn = jax.jit(lambda t, n, data: model.stateless_call(t, n, data, training=False)[0])
        data = jax.device_put(x)
        return lambda: fn(trainable, non_trainable, data).block_until_ready()
    if backend == "torch":
        import torch

        data = keras.ops.convert_to_tensor(x)
        cuda = torch.cuda.is_available()

        def call():
            with torch.no_grad():
                out = model(data, training=False)
            if cuda:
                torch.cuda.synchronize()
            return out

        return call
    return lambda: keras.ops.convert_to_numpy(model(x, training=False))


def interleaved(calls, rounds, unit_seconds):
    """``{name: [seconds per call, one per round]}``: warm-up, then units of the same number of calls, alternating."""
    sizing = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        t0 = time.perf_counter()
        for _ in range(5):
            call()
        sizing[name] = (time.perf_counter() - t0) / 5
    n = max(1, math.ceil(unit_seconds / max(min(sizing.values()), 1e-9)))
    names, samples = list(calls), {name: [] for name in calls}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            for _ in range(n):
                calls[name]()
            samples[name].append((time.perf_counter() - t0) / n)
    return samples, n


def check_cnn(quick):
    import keras
    import numpy as np

    from keras_group_lasso import prune_model

    rounds, unit_seconds = (3, 0.02) if quick else (15, 0.1)
    rng = np.random.default_rng(0)
    dense = vgg(0)
    random_statistics(dense, rng)
    zeroed = keras.models.clone_model(dense)
    zeroed.set_weights(dense.get_weights())
    convs = [layer.name for layer in zeroed.layers if isinstance(layer, keras.layers.Conv2D)]
    drop_channels(zeroed, list(zip(convs, convs[1:] + ["dense"])), 0.25, rng)
    t0 = time.perf_counter()
    pruned = prune_model(zeroed, THRESHOLD)
    prune_s = time.perf_counter() - t0
    report = pruned.pruning_report
    kept = [pruned.get_layer(name).filters for name in convs]
    x_all = rng.uniform(size=(256, 28, 28, 1)).astype("float32")
    with full_float32():
        diff, scale, rel = relative_difference(outputs(pruned, x_all), outputs(thresholded_copy(zeroed), x_all))
    say(f"cnn: channels {[layer.filters for layer in dense.layers if isinstance(layer, keras.layers.Conv2D)]} -> "
        f"{kept}; multiply-adds {report.flops_before:,} -> {report.flops_after:,}; timing ...")

    rows = []
    for batch in (1, 256):
        x = x_all[:batch]
        for method in ("predict_on_batch", "direct call"):
            if method == "predict_on_batch":
                calls = {"dense": lambda m=dense, x=x: m.predict_on_batch(x),
                         "pruned": lambda m=pruned, x=x: m.predict_on_batch(x)}
            else:
                calls = {"dense": direct_call(dense, x), "pruned": direct_call(pruned, x)}
            samples, per_unit = interleaved(calls, rounds, unit_seconds)
            d, p = statistics.median(samples["dense"]), statistics.median(samples["pruned"])
            rows.append({"batch": batch, "method": method, "calls_per_unit": per_unit,
                         "dense_ms": 1e3 * d, "pruned_ms": 1e3 * p, "speedup": d / p,
                         "dense_ms_rounds": [1e3 * v for v in samples["dense"]],
                         "pruned_ms_rounds": [1e3 * v for v in samples["pruned"]]})
            say(f"  batch {batch}, {method}: dense {1e3 * d:.3f} ms, pruned {1e3 * p:.3f} ms ({d / p:.2f}x)")
            progress({"channels_kept": kept, "flops_before": report.flops_before, "flops_after": report.flops_after,
                      "relative_diff_float32": rel, "timings": rows})
    result = {
        "channels_kept": kept,
        "prune_s": prune_s,
        "params_before": dense.count_params(),
        "params_after": pruned.count_params(),
        "flops_before": report.flops_before,
        "flops_after": report.flops_after,
        "flop_ratio": report.flops_before / max(report.flops_after, 1),
        "relative_diff_float32": rel,
        "max_abs_diff_float32": diff,
        "rounds": rounds,
        "timings": rows,
    }
    speed = ", ".join(f"b{r['batch']} {'pob' if r['method'] == 'predict_on_batch' else 'call'} {r['speedup']:.2f}x"
                      for r in rows)
    summary = f"flops /{result['flop_ratio']:.1f}; speed-up {speed}"
    return result, summary


_STATE = {}


def progress(result):
    """Write what a check has measured so far, so that a check stopped at its time limit keeps it."""
    if _STATE:
        _STATE["out"]["result"] = result
        Path(_STATE["path"]).write_text(json.dumps({**_STATE["out"], "status": "running"}, indent=1, default=str))


def child(check, result_path, quick):
    """Run one check in this process; write ``{"result", "summary"}`` or ``{"error"}`` to ``result_path``."""
    out = {}
    _STATE.update(path=result_path, out=out)
    t0 = time.perf_counter()
    try:
        import keras

        out["keras"] = keras.__version__
        out["backend"] = keras.backend.backend()
        out["device"] = device_name()
        result, summary = {"resnet50": check_resnet50, "training": check_training, "cnn": check_cnn}[check](quick)
        out.update(status="ok", result=result, summary=summary)
    except BaseException as error:  # noqa: BLE001 - recorded, the run goes on with the next check
        out.update(status="error", error="".join(traceback.format_exception(error)))
    out["seconds"] = time.perf_counter() - t0
    out["tensorflow_imported"] = "tensorflow" in sys.modules
    Path(result_path).write_text(json.dumps(out, indent=1, default=str))
    return 0 if out["status"] == "ok" else 1


# ----------------------------------------------------------------------------- the driver (parent process)


def versions():
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in ("keras", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "torch", "numpy", "optree",
                 "ml-dtypes", "h5py", "tensorflow"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def gpu_name():
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def run_child(check, backend, args, timeout, workdir):
    """One check on one backend in a fresh process; its output is echoed with a prefix and its tail kept."""
    result_path = workdir / f"{check}_{backend}.json"
    result_path.unlink(missing_ok=True)
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", check, "--result", str(result_path)]
    if args.quick:
        command.append("--quick")
    tail = collections.deque(maxlen=40)
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)

    def pump():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            sys.stdout.write(f"  [{backend} {check}] {line}")
            sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    reader.join(timeout=10)
    elapsed = time.perf_counter() - t0
    record = {"check": check, "backend": backend, "wall_s": elapsed, "exit_code": proc.returncode}
    stopped = f"stopped after {timeout:.0f} s (time limit of this check); result: what it had measured by then"
    if result_path.exists():
        try:
            record.update(json.loads(result_path.read_text()))
        except ValueError as error:  # written while it was stopped
            record.update(status="crashed", error=f"unreadable result ({error})")
        if timed_out:
            record.update(status="timeout", error=stopped)
        elif record.get("status") == "running":
            record.update(status="crashed", error=f"the process ended with code {proc.returncode} during the check")
    elif timed_out:
        record.update(status="timeout", error=stopped)
    else:
        record.update(status="crashed", error=f"the process ended with code {proc.returncode} and no result")
    if record.get("status") != "ok":
        record["log_tail"] = list(tail)
    return record


def cell(record):
    if record.get("status") == "ok":
        return record.get("summary", "")
    error = (record.get("error") or "").strip().splitlines()
    return (error[-1] if error else "")[:160]


def notes(run, gpu, found):
    return [f"GPU (nvidia-smi): {gpu or 'none found'}",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in found.items()),
            f"Mode: {'--quick (small sizes)' if run.quick else 'full sizes'}",
            ("Each check ran in its own process on the backend its row names (the Backend line above is the driver's, "
             "which only writes these results)"),
            ("`TF imported`: whether `tensorflow` was in `sys.modules` when the check ended (Keras probes for it "
             "lazily where it is installed; nothing here needs it)")]


def body(records):
    """The table of the checks, then every check's numbers (or its error and the last lines of its output)."""
    lines = ["| check | backend | status | device | s | TF imported | result |", "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['check']} | {r['backend']} | {r.get('status')} | {r.get('device', '')} | "
                     f"{r.get('wall_s', 0):.0f} | {r.get('tensorflow_imported', '')} | {cell(r).replace('|', '/')} |")
    for r in records:
        lines += ["", f"## {r['check']} ({r['backend']})", ""]
        if r.get("status") != "ok":
            lines += ["```text", (r.get("error") or "").rstrip(), "```"]
            if r.get("log_tail"):
                lines += ["", "Last lines of its output:", "", "```text", *r["log_tail"][-20:], "```"]
            if r.get("result"):
                lines += ["", "Measured before it stopped:", ""]
        if r.get("result"):
            for key, value in r["result"].items():
                if key == "timings":
                    lines += ["", "| batch | method | dense ms | pruned ms | speed-up | calls/unit |",
                              "|---|---|---|---|---|---|"]
                    lines += [f"| {t['batch']} | {t['method']} | {t['dense_ms']:.3f} | {t['pruned_ms']:.3f} | "
                              f"{t['speedup']:.2f}x | {t['calls_per_unit']} |" for t in value]
                    continue
                if isinstance(value, float):
                    value = f"{value:.4g}"
                elif isinstance(value, dict):
                    value = ", ".join(f"{k}: {v:.4g}" if isinstance(v, float) else
                                      f"{k}: " + (", ".join(f"{e:.4g}" for e in v) if isinstance(v, list) else str(v))
                                      for k, v in value.items())
                lines.append(f"- {key}: {value}")
    return "\n".join(lines) + "\n"


def publish(run, records, gpu, found, quiet=True):
    """Write the results so far (a run cut short keeps them); ``quiet``: without printing them (after each check).
    RESULTS.md's index row: every check's status and summary."""
    what = f"{TITLE} on {gpu or 'no GPU'}: " + "; ".join(f"{r['check']} ({r['backend']}) {r.get('status')}: {cell(r)}"
                                                          for r in records)
    return run.publish(TITLE, body(records), records, notes=notes(run, gpu, found), section=False, summary=what,
                       quiet=quiet, gpu=gpu, versions=found)


def main(argv=None):
    parser = common.arguments(__doc__, quick="small sizes, to try the script on a CPU; results to benchmarks/out/")
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="folder for NAME.json and NAME.md (default $OUT, else benchmarks/results; --quick: "
                             "benchmarks/out)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    parser.add_argument("--deadline", type=float, default=None,
                        help=f"seconds for the whole run (default {DEADLINE:g}; --quick: none)")
    parser.add_argument("--child", choices=CHECKS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.result, args.quick)

    # The results' machine line imports Keras in this process: on a backend that is installed (TensorFlow may not be).
    os.environ.setdefault("KERAS_BACKEND", args.backends[0])
    run = common.Run(NAME, args)
    if args.out:
        run.out = Path(args.out)
    deadline = args.deadline or (1e9 if args.quick else DEADLINE)
    work = Path(tempfile.mkdtemp(prefix="gpu-checks-"))
    gpu, found = gpu_name(), versions()
    say(f"GPU: {gpu or 'none found'}; " + ", ".join(f"{k} {v}" for k, v in found.items()))
    records = []
    for check in args.checks:
        for backend in args.backends:
            left = deadline - run.elapsed
            if left < 15:
                records.append({"check": check, "backend": backend, "status": "skipped",
                                "error": f"not started: {deadline:.0f} s deadline of the run reached"})
                continue
            timeout = left if args.quick else min(CAPS[check], left)
            say(f"{check} on {backend}" + ("" if args.quick else f" (at most {timeout:.0f} s)"))
            record = run_child(check, backend, args, timeout, work)
            records.append(record)
            say(f"{check} on {backend}: {record.get('status')} in {record['wall_s']:.1f} s: {cell(record)}")
            publish(run, records, gpu, found)
    shutil.rmtree(work, ignore_errors=True)
    publish(run, records, gpu, found, quiet=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
