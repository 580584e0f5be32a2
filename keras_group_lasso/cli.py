"""The ``keras-group-lasso`` command line, built on the public API only.

Subcommands:
    demo   train a group-sparse MLP on the bundled DIGITS data and report it
    prune  cut a trained .keras model down to its live units and export it
    bench  run the paper-reproduction benchmarks of a source checkout

Only the standard library is imported here at module level: the parser, ``--help`` and usage
errors need nothing else. Keras, a backend and the package's API are imported inside the
commands that use them (tests/test_cli.py checks this by loading this file on its own).
"""

import argparse
import sys


def _positive_int(text):
    """argparse type: an integer >= 1, checked before anything runs or is written."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; received {text!r}")
    return value


def _add_demo(subparsers):
    p = subparsers.add_parser(
        "demo",
        help="train a sparse-group-Lasso MLP on DIGITS and print what it kept",
        description="Train a 64-40-20-10 MLP with the sparse group Lasso on scikit-learn's "
        "bundled DIGITS data (the paper's first experiment), then print test accuracy, "
        "sparsity, the selected input features and the live neurons.",
    )
    p.add_argument("--epochs", type=int, default=200, help="training epochs (default 200)")
    p.add_argument("--factor", type=float, default=1e-3, help="penalty strength lambda (default 1e-3)")
    p.add_argument("--threshold", type=float, default=1e-3, help="pruning threshold (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=_run_demo)


def _run_demo(args):
    from keras_group_lasso import demo
    from keras_group_lasso._validation import InvalidParameterError

    arguments = dict(epochs=args.epochs, factor=args.factor, threshold=args.threshold, seed=args.seed)
    try:
        demo.check_arguments(**arguments, owner="keras-group-lasso demo: error", prefix="--")
    except InvalidParameterError as e:  # before anything is loaded or trained
        print(f"{e}", file=sys.stderr)
        return 2
    try:
        return demo.run(**arguments)
    except (ValueError, ImportError, OSError) as e:  # e.g. a training that diverged, or no data
        print(f"keras-group-lasso demo: error: {e}", file=sys.stderr)
        return 1


def _add_prune(subparsers):
    p = subparsers.add_parser(
        "prune",
        help="remove dead features and units from a .keras model and export the smaller model",
        description="Load MODEL (a .keras file, Keras safe mode), remove every input feature and "
        "hidden unit whose outgoing weights are all <= threshold, and write the smaller model "
        "to OUT_DIR (SavedModel, .keras, optionally TFLite, ONNX and int8 TFLite, plus manifest.json). "
        "Other files in OUT_DIR are left as they are. "
        "Nothing is written into OUT_DIR when anything fails.",
    )
    p.add_argument("model", metavar="MODEL", help="trained model saved as .keras")
    p.add_argument("out_dir", metavar="OUT_DIR",
                   help="export directory (created if missing; it must not hold an earlier export unless --overwrite)")
    p.add_argument("--threshold", type=float, default=1e-3, help="weights with |w| <= threshold count as zero (default 1e-3)")
    p.add_argument(
        "--inputs",
        choices=("original", "selected"),
        default="original",
        help="'original': the exported model takes the full feature vector (default); "
        "'selected': only the kept features (see manifest.json)",
    )
    p.add_argument(
        "--formats",
        nargs="+",
        choices=("saved_model", "keras", "tflite", "onnx", "tflite-int8"),
        default=["saved_model", "keras"],
        help="what to write (default: saved_model keras); onnx needs the onnx extra "
        "(pip install \"keras-group-lasso[onnx]\"), tflite-int8 needs --representative",
    )
    p.add_argument("--representative", metavar="DATA",
                   help="inputs to calibrate the int8 model on and to check onnx and tflite-int8 against: a .npy "
                   "array of the exported model's inputs, or a .npz file with one array per input, by input name")
    p.add_argument("--round-to", type=_positive_int, default=1, metavar="N",
                   help="each hidden layer keeps a multiple of N units (default 1: only the live ones; "
                   "8 often runs faster on CPUs and GPUs)")
    p.add_argument("--fold-batchnorm", action="store_true",
                   help="merge each BatchNormalization that follows a Dense or convolution layer into it")
    p.add_argument("--blocks", choices=("rebuild", "uniform", "flatten"), default="rebuild",
                   help="a block of the model's own class: 'rebuild' (default) makes it again with its new widths "
                   "where its config can say them; 'uniform' too, with every block of one class as wide (a KerasHub "
                   "Task stays its class); 'flatten' writes its layers as plain Keras layers")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in OUT_DIR: only saved_model/, model.keras, model.tflite, model.onnx, "
                   "model_int8.tflite and manifest.json are replaced or removed, other files stay")
    p.set_defaults(func=_run_prune)


def _run_prune(args):
    import os

    import keras

    import keras_group_lasso  # with Keras imported, the package's serializable objects are registered

    def error(message):
        print(f"keras-group-lasso prune: error: {message}", file=sys.stderr)
        return 1

    refused = _refused_prune_options(args)
    if refused:  # a usage error, named by its option, before anything is read or loaded
        print(refused, file=sys.stderr)
        return 2
    if not os.path.isfile(args.model):
        return error(f"no such model file: {args.model!r}")
    unreadable = _unreadable_archive(args.model)
    if unreadable:
        return error(unreadable)
    if args.overwrite:
        clash = _export_would_replace(args.model, args.out_dir)
        if clash:
            return error(
                f"MODEL {args.model!r} is {clash!r}, which --overwrite would replace; "
                "write to another OUT_DIR or move the model first"
            )
    representative = None
    if args.representative is not None:
        try:
            representative = _load_representative(args.representative)
        except (OSError, ValueError) as e:
            return error(f"cannot read --representative {args.representative!r}: {e}")
    try:
        model = keras.saving.load_model(args.model, compile=False, safe_mode=True)
    except Exception as e:  # a corrupt or foreign file: any loader error means "cannot load"
        return error(_load_error(args.model, e))
    try:
        result = keras_group_lasso.export_pruned(
            model,
            args.out_dir,
            threshold=args.threshold,
            formats=tuple(dict.fromkeys(args.formats)),
            inputs=args.inputs,
            overwrite=args.overwrite,
            round_to=args.round_to,
            fold_batchnorm=args.fold_batchnorm,
            representative_data=representative,
            blocks=args.blocks,
        )
    except (ValueError, TypeError, ImportError, OSError, RuntimeError) as e:
        return error(str(e))
    m = result.manifest
    before, after = m["params_before"], m["params_after"]
    print(result.report)
    print()
    print(f"kept    {m['n_kept_features']} of {m['n_features']} input features")
    print(
        "layers  "
        + "-".join(map(str, m["layer_sizes_before"]))
        + " -> "
        + "-".join(map(str, m["layer_sizes_after"]))
    )
    ratio = f" ({before / after:.1f}x fewer)" if after else ""
    print(f"params  {before} -> {after}{ratio}")
    sizes = m.get("file_sizes", {})
    for i, path in enumerate(result.paths.values()):
        size = sizes.get(os.path.basename(path))
        print(("wrote   " if i == 0 else "        ") + path + ("" if size is None else f"  ({size} bytes)"))
    if "onnx" in m:
        print(f"onnx    max |onnx - keras| {m['onnx']['max_abs_error']:.3g} on {m['onnx']['checked_rows']} rows "
              f"(tolerance {m['onnx']['tolerance']:.3g})")
    if "tflite_int8" in m:
        measured = m["tflite_int8"]["error_on_representative_data"]
        agreement = measured.get("argmax_agreement")
        print(f"int8    mean |int8 - float| {measured['mean_relative_error']:.2%}, max "
              f"{measured['max_relative_error']:.2%} of the output scale on {measured['rows']} rows"
              + ("" if agreement is None else f", argmax agreement {agreement:.2%}"))
    for word, paths in (("replaced", result.replaced), ("removed ", result.removed)):
        for i, path in enumerate(paths):
            print((word if i == 0 else "        ") + path)
    return 0


def _refused_prune_options(args):
    """The message for the first bad option of ``prune`` (by its command-line name), or None."""
    from keras_group_lasso._validation import InvalidParameterError, check_non_negative, fail

    owner = "keras-group-lasso prune: error"
    try:
        check_non_negative(owner, "--threshold", args.threshold)
        calibrated = {"onnx", "tflite-int8"} & set(args.formats)
        if "tflite-int8" in args.formats and args.representative is None:
            fail(owner, "--representative", "given with --formats tflite-int8: a .npy or .npz file of the exported "
                 "model's inputs to calibrate on", None)
        if args.representative is not None and not calibrated:
            fail(owner, "--representative", "given only with --formats onnx or tflite-int8 (the formats checked "
                 f"on it); --formats is {' '.join(args.formats)}", args.representative)
    except InvalidParameterError as e:
        return str(e)
    return None


def _load_representative(path):
    """The array of a .npy file, or the dict of arrays (by input name) of a .npz file, without pickles."""
    import numpy as np

    data = np.load(path, allow_pickle=False)
    if isinstance(data, np.ndarray):
        return data
    with data:
        return {name: data[name] for name in data.files}


def _unreadable_archive(path):
    """Why ``path``, named ``*.keras``, is not a .keras archive (a zip file holding config.json), or None.

    Keras says "File not found" for such a file, which exists.
    """
    import zipfile

    if not path.endswith(".keras"):
        return None  # Keras names the formats it reads
    try:
        with zipfile.ZipFile(path) as archive:
            if "config.json" in archive.namelist():
                return None
            cause = "a zip archive without config.json"
    except (zipfile.BadZipFile, OSError) as e:
        cause = f"{type(e).__name__}: {e}"
    return f"cannot load {path!r}: it is not a readable .keras archive (a zip file holding config.json): {cause}"


def _export_would_replace(model, out_dir):
    """The artifact of OUT_DIR that MODEL is (the export would replace it with --overwrite), or None."""
    import os

    from keras_group_lasso.export import ARTIFACTS

    model, out_dir = os.path.realpath(model), os.path.realpath(out_dir)
    for name in ARTIFACTS:
        artifact = os.path.join(out_dir, name)
        if model == artifact or model.startswith(artifact + os.sep):
            return artifact
    return None


def _load_error(path, error):
    """A short reason why ``path`` did not load, naming the custom objects that are not registered."""
    import re

    import keras

    import keras_group_lasso

    text = str(error)
    # Keras repeats the model's whole config at each level; the last "Exception encountered" is the cause.
    cause = text.rsplit("Exception encountered:", 1)[-1].strip()
    if len(cause) > 300:
        cause = cause[:300] + " ..."
    message = f"cannot load {path!r} as a Keras model: {type(error).__name__}: {cause}"
    names = set(re.findall(r"'registered_name': '([^']+>[^']+)'", text))
    missing = sorted(name for name in names if keras.saving.get_registered_object(name) is None)
    ours = [name for name in missing if name.startswith("keras_group_lasso>")]
    others = [name for name in missing if name not in ours]
    if ours:
        message += (
            f" keras_group_lasso {keras_group_lasso.__version__} has no {', '.join(ours)}: "
            "install the version that saved the file."
        )
    if others:
        message += (
            f" The file uses custom objects that are not registered: {', '.join(others)}; this command "
            "knows Keras's and keras_group_lasso's objects only (in Python, import the module that "
            "defines them before keras.saving.load_model)."
        )
    return message


BENCHMARKS = {"digits": "digits_sweep.py", "fashion-mnist": "fashion_table.py", "peers": "peers_digits.py", "all": "run_all.py"}


def _add_bench(subparsers):
    p = subparsers.add_parser(
        "bench",
        help="reproduce the paper's experiments (needs a source checkout)",
        description="Run a benchmark script from the benchmarks/ folder of a source checkout "
        "(next to the installed package): the DIGITS lambda sweep, the Fashion-MNIST table, "
        "magnitude pruning vs SGL on DIGITS, or all of them with the performance benchmarks. "
        "Full runs write benchmarks/RESULTS.md and benchmarks/results/.",
    )
    p.add_argument("name", choices=tuple(BENCHMARKS), help="which benchmark")
    p.add_argument("--seeds", type=_positive_int, default=None, help="number of seeds (script default when omitted)")
    p.add_argument("--quick", action="store_true", help="a short smoke run that writes to benchmarks/out/ only")
    p.set_defaults(func=_run_bench)


def _run_bench(args):
    import pathlib
    import subprocess

    folder = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    script = folder / BENCHMARKS[args.name]
    if not script.is_file():
        print(
            f"keras-group-lasso bench: error: {script} not found; the benchmarks live in the "
            "benchmarks/ folder of a source checkout (git clone, then pip install -e .)",
            file=sys.stderr,
        )
        return 1
    command = [sys.executable, str(script)]
    if args.quick:
        command.append("--quick")
    if args.seeds is not None:
        command += ["--seeds", str(args.seeds)]
    return subprocess.call(command, cwd=folder.parent)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-group-lasso",
        description="Group sparse regularization for Keras 3: compact networks and selected features.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_demo(subparsers)
    _add_prune(subparsers)
    _add_bench(subparsers)
    return parser


def main(argv=None):
    """Entry point of the ``keras-group-lasso`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
