"""Shared pieces of the paper-reproduction benchmarks: models, machine info, Markdown, RESULTS.md sections.

Everything here uses the public API of keras_group_lasso only; nothing in the
package imports it.
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS_MD = HERE / "RESULTS.md"
RESULTS_DIR = HERE / "results"

# The penalties compared in the paper (plus the proximal variant of SGL).
# "penalty" selects the regularizers, "proximal" wraps Adam in keras_group_lasso.Proximal.
METHODS = {
    "L2": {"penalty": "l2", "proximal": False, "label": "L2-NN"},
    "L1": {"penalty": "l1", "proximal": False, "label": "L1-NN"},
    "GL": {"penalty": "group", "proximal": False, "label": "G-L1-NN (group Lasso)"},
    "SGL": {"penalty": "sgl", "proximal": False, "label": "SG-L1-NN (sparse group Lasso)"},
    "SGL-prox": {"penalty": "sgl", "proximal": True, "label": "SG-L1-NN, proximal Adam"},
}


def say(message):
    """Progress line with a wall-clock stamp, flushed at once (benchmarks run under nohup)."""
    stamp = time.strftime("%H:%M:%S")
    sys.stdout.write(f"[{stamp}] {message}\n")
    sys.stdout.flush()


def proximal_class():
    """``keras_group_lasso.Proximal`` (or its module while it is not exported yet), else None."""
    import keras_group_lasso

    if hasattr(keras_group_lasso, "Proximal"):
        return keras_group_lasso.Proximal
    try:
        from keras_group_lasso.optimizers import Proximal
    except ImportError:
        return None
    return Proximal


def proximal_available():
    """True when proximal training can be benchmarked."""
    return proximal_class() is not None


def build_mlp(n_features, n_classes, hidden, penalty, factor):
    """A ReLU MLP with softmax output; ``penalty`` on every kernel and every bias (the paper's layout).

    ``penalty``: ``"none"``, ``"l2"``, ``"l1"`` (Keras regularizers), ``"group"``
    or ``"sgl"`` (:func:`keras_group_lasso.add_group_sparsity`: input groups on
    the first kernel, hidden groups on the others, bias groups; SGL with
    ``l1 = factor``).
    """
    import keras

    from keras_group_lasso import add_group_sparsity

    plain = {"l2": keras.regularizers.L2, "l1": keras.regularizers.L1}.get(penalty)

    def reg():
        return plain(factor) if plain is not None else None

    layers = [keras.Input((n_features,))]
    for units in hidden:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg(), bias_regularizer=reg()))
    layers.append(keras.layers.Dense(n_classes, activation="softmax", kernel_regularizer=reg(), bias_regularizer=reg()))
    model = keras.Sequential(layers)
    if penalty in ("group", "sgl"):
        model = add_group_sparsity(model, factor, penalty=penalty, bias=True)
    return model


def make_model(method, n_features, n_classes, hidden, factor, seed, learning_rate=1e-3):
    """Seeded, compiled model for one entry of :data:`METHODS` (Adam, or proximal Adam)."""
    import keras

    spec = METHODS[method]
    keras.utils.set_random_seed(seed)
    model = build_mlp(n_features, n_classes, hidden, spec["penalty"], factor)
    optimizer = keras.optimizers.Adam(learning_rate)
    if spec["proximal"]:
        optimizer = proximal_class()(optimizer)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def accuracy(model, x, y, batch_size=2048):
    """Classification accuracy of ``model`` on ``(x, y)``."""
    predictions = model.predict(x, batch_size=batch_size, verbose=0)
    return float(np.mean(np.argmax(predictions, axis=1) == np.asarray(y)))


def cpu_model():
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def default_output(name, quick):
    """benchmarks/results/<name>.md for a full run, benchmarks/out/<name>.md for --quick."""
    return str(HERE / ("out" if quick else "results") / f"{name}.md")


def machine_info():
    """Cores, CPU model, OS, backend and library versions, as a dict of strings."""
    import keras

    cpu = cpu_model()
    versions = {"Python": platform.python_version(), "Keras": keras.__version__, "NumPy": np.__version__}
    for name, module in (("TensorFlow", "tensorflow"), ("JAX", "jax")):
        try:
            versions[name] = __import__(module).__version__
        except ImportError:
            pass
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu,
        "os": f"{platform.system()} {platform.release()}",
        "backend": keras.backend.backend(),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


def machine_line():
    """One line: cores, CPU, OS; Python, Keras, TensorFlow and JAX versions."""
    info = machine_info()
    return f"{info['cores']} cores, {info['cpu']}, {info['os']}; {info['versions']}"


def header(command, seeds, started, elapsed, notes=()):
    """The lines every RESULTS.md section starts with: command, date, machine, seeds."""
    info = machine_info()
    lines = [
        f"- Command: `{command}`",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; wall time {elapsed / 60:.1f} min",
        f"- Machine: {info['cores']} cores, {info['cpu']}, {info['os']} (shared with other jobs while it ran)",
        f"- Backend: {info['backend']}; {info['versions']}",
    ]
    if seeds:
        lines.append(f"- Seeds: {', '.join(map(str, seeds))}")
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


def command_line():
    """How this script was invoked, as a shell command a reader can copy."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(HERE.parent)
    except ValueError:
        pass
    return " ".join([f"KERAS_BACKEND={backend}", "python", str(script), *sys.argv[1:]])


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def mean_std(values, digits=1, scale=1.0):
    """``"m ± s"`` of ``values * scale`` (sample std; ``"m"`` alone for one value)."""
    values = [scale * v for v in values]
    m = statistics.fmean(values)
    if len(values) < 2:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown_table(header_row, rows):
    """A GitHub Markdown table from a header and rows of strings."""
    lines = ["| " + " | ".join(header_row) + " |", "|" + "|".join("---" for _ in header_row) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _int_at_least(text, minimum):
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}; received {text!r}")
    return value


def positive_int(text):
    """argparse type: an integer >= 1 (``--seeds 0`` would train nothing and then write empty results)."""
    return _int_at_least(text, 1)


def non_negative_int(text):
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


@contextlib.contextmanager
def staged(out):
    """A scratch folder whose files replace those of ``out`` only when the block succeeds.

    A run that fails half-way (or is interrupted) leaves the results already
    in ``out`` as they were: no figure of the new run next to a JSON of the old one.

    Example:
        >>> with staged(RESULTS_DIR) as stage:
        ...     fig.savefig(stage / "sweep.png")
        ...     (stage / "sweep.json").write_text(text)
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=out))
    try:
        yield scratch
        for path in sorted(scratch.iterdir()):
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_text_atomically(path, text):
    """Write ``text`` to ``path`` through a temporary file, so ``path`` is never half-written."""
    path = Path(path)
    with staged(path.parent) as stage:
        (stage / path.name).write_text(text)
    return path


def write_section(key, title, body, path=None):
    """Insert or replace the section ``key`` of RESULTS.md (or ``path``) between HTML comment markers."""
    path = Path(path or RESULTS_MD)
    begin, end = f"<!-- BEGIN {key} -->", f"<!-- END {key} -->"
    section = f"{begin}\n## {title}\n\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n\nEach section is written by the script named in its command line.\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    write_text_atomically(path, text if text.endswith("\n") else text + "\n")
    return path


INDEX = "## Index of every experiment"


def write_index_row(script, name, cells, path=None):
    """Insert or replace the row of experiment ``name`` in RESULTS.md's index (or ``path``'s), under
    ``### `benchmarks/<script>``` (a new heading goes in alphabetical order). ``cells``: what, command, date,
    machine, files (Markdown; a ``|`` inside a cell is escaped)."""
    path = Path(path or RESULTS_MD)
    text = path.read_text() if path.exists() else f"# Benchmark results\n\n{INDEX}\n"
    if INDEX not in text:
        text = text.rstrip() + f"\n\n{INDEX}\n"
    start = text.index(INDEX) + len(INDEX)
    later = re.search(r"^(## |<!-- BEGIN )", text[start:], re.M)
    end = start + later.start() if later else len(text)
    index = text[start:end]
    row = "| " + " | ".join(c.replace("|", "\\|") for c in [name, *cells]) + " |"
    heading = f"### `benchmarks/{script}`"
    if heading not in index:
        blocks = re.split(r"(?=^### )", index, flags=re.M)
        table = f"{heading}\n\n| experiment | what | command | date | machine | files |\n|---|---|---|---|---|---|\n"
        at = next((i for i, b in enumerate(blocks) if b.startswith("### ") and b > heading), len(blocks))
        blocks.insert(at, table + row + "\n\n")
        index = "".join(blocks)
    else:
        begin = index.index(heading)
        block_end = re.search(r"^### ", index[begin + len(heading):], re.M)
        block_end = begin + len(heading) + block_end.start() if block_end else len(index)
        block = index[begin:block_end]
        mine = re.compile(r"^\| " + re.escape(name) + r"( \(seeds [^|]*\))? \|.*$", re.M)
        if mine.search(block):
            block = mine.sub(lambda _: row, block, count=1)
        else:
            lines = block.rstrip("\n").split("\n")
            block = "\n".join(lines + [row]) + "\n\n"
        index = index[:begin] + block + index[block_end:]
    write_text_atomically(path, text[:start] + index + text[end:])
    return path


def arguments(doc, seeds=None, quick="a smoke run: results to benchmarks/out/, RESULTS.md untouched"):
    """The arguments every benchmark takes: ``--quick`` (help ``quick``), ``--out-name`` (the results' file name,
    default the script's) and, when ``seeds`` is a number, ``--seeds N`` (seeds 0..N-1, default ``seeds``). A script
    adds its own arguments to the parser this returns and hands the parsed namespace to :class:`Run`."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    if seeds is not None:
        parser.add_argument("--seeds", type=positive_int, default=seeds, help=f"seeds 0..N-1 (default {seeds})")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out-name", default=None, help="results file name without extension (default the script's)")
    return parser


class Run:
    """One benchmark run: its arguments, its clock, where it writes; :meth:`publish` writes its results once.

    A full run writes ``benchmarks/results/<name>.md`` and ``.json``, the section ``<name>`` of RESULTS.md and the
    run's row in its index; a ``--quick`` run writes the same two files to ``benchmarks/out/``, and a run given an
    ``output`` (a file name ``x.md``, a prefix ``x`` or a folder) writes them there; both leave RESULTS.md alone.

    Example:
        >>> run = Run("digits", parser.parse_args())
        >>> records = [train(seed) for seed in run.seeds]
        >>> run.publish("DIGITS sweep", table(records), records, notes=["200 epochs"])
    """

    def __init__(self, name, args, seeds=None, output=None):
        self.args = args
        self.name = getattr(args, "out_name", None) or name
        self.quick = bool(getattr(args, "quick", False))
        if seeds is None:  # a timing without seeds: none said
            seeds = ([0] if self.quick else list(range(args.seeds))) if hasattr(args, "seeds") else []
        self.seeds = list(seeds)
        self.started = now()
        self._clock = time.perf_counter()
        self.out = HERE / "out" if self.quick else RESULTS_DIR
        if output is not None:  # a file name (``x.md`` or a prefix ``x``) or a folder
            output = Path(output)
            if output.suffix in (".md", ".json") or not output.is_dir():
                self.out, self.name = output.parent, output.name.removesuffix(".md").removesuffix(".json")
            else:
                self.out = output
        self._files = []  # besides <name>.md and .json
        self.script = Path(sys.argv[0]).name  # the index row's heading

    @property
    def writes_results_md(self):
        """A full run into ``benchmarks/results/`` writes its RESULTS.md section and index row; a quick run, or one
        written elsewhere (``output``), does not."""
        return not self.quick and Path(self.out).resolve() == Path(RESULTS_DIR).resolve()

    @property
    def elapsed(self):
        """Wall seconds since the run began."""
        return time.perf_counter() - self._clock

    def path(self, suffix):
        """``<out>/<name><suffix>``: where this run writes a file of its own (a figure: ``run.path(".png")``);
        listed in the run's RESULTS.md index row when it exists at :meth:`publish`."""
        return self.file(f"{self.name}{suffix}")

    def file(self, filename):
        """``<out>/<filename>``: a file of this run under another name (a figure the README links by name), listed
        in its index row as :meth:`path`'s are."""
        self._files.append(filename)
        return self.out / filename

    def staged(self):
        """A scratch folder whose files land in this run's folder only when the block succeeds (figures)."""
        return staged(self.out)

    def header(self, notes=()):
        """Command, date, wall time, machine, backend, seeds, then ``notes``: the lines every result starts with."""
        return header(command_line(), self.seeds, self.started, self.elapsed, notes)

    def publish(self, title, body, records, notes=(), section=True, summary=None, quiet=False, **extra):
        """Write the results: ``<name>.md`` (``# title``, the header with ``notes``, ``body``) and ``<name>.json``
        (command, date, wall seconds, machine, arguments, ``records`` and ``extra``); unless quick, the same text as
        a section of RESULTS.md: ``<name>`` when ``section`` is True, that key when it is a string, none when it is
        False (a result the index links to), and the run's row in RESULTS.md's index (:func:`write_index_row`:
        ``summary`` or the title, the command, date, machine and files). Prints the text unless ``quiet`` (a run
        that publishes after every part, so that one cut short keeps them); returns the .md path."""
        elapsed = self.elapsed
        text = self.header(notes) + "\n\n" + body.rstrip() + "\n"
        self.out.mkdir(parents=True, exist_ok=True)
        payload = {"command": command_line(), "date": f"{self.started:%Y-%m-%d %H:%M} UTC", "wall_seconds": elapsed,
                   "machine": machine_info(), "args": vars(self.args), "records": records, **extra}
        write_text_atomically(self.path(".json"), json.dumps(payload, indent=1, default=_plain))
        # the same text as the section; its links to results/ files are next to it there
        markdown = write_text_atomically(self.path(".md"), f"# {title}\n\n" + text.replace("](results/", "]("))
        if self.writes_results_md:
            if section:
                write_section(self.name if section is True else section, title, text)
            self._index_row(title if summary is None else summary, section)
        if not quiet:
            print(text)
            say(f"wrote {markdown} and .json in {elapsed / 60:.1f} min")
        return markdown

    def _index_row(self, what, section):
        info = machine_info()
        files = [self.out / f for f in dict.fromkeys([f"{self.name}.md", f"{self.name}.json", *self._files])]
        links = ", ".join(f"[{f.name}](results/{f.name})" for f in files if f.exists())
        name = self.name if len(self.seeds) < 2 else f"{self.name} (seeds {', '.join(map(str, self.seeds))})"
        write_index_row(self.script, name, [
            what + ("; section below" if section else ""), f"`{command_line()}`",
            f"{self.started:%Y-%m-%d %H:%M} UTC", f"{info['cores']} cores, {info['cpu']} (shared with other jobs "
            "while it ran)", links])


def _plain(value):
    """JSON for what ``json`` does not know: numpy numbers and arrays, paths, anything else as text."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value) if isinstance(value, Path) else float(value)


def save_json(name, payload):
    """Raw numbers next to the figures, for anyone who wants to re-plot them."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    path.write_text(json.dumps(payload, indent=1, default=float))
    return path


def pyplot():
    """matplotlib.pyplot with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def feature_image(model, image_shape):
    """Per-pixel strength ``||W1[i, :]||_2`` of the first Dense kernel, reshaped to the image."""
    from keras_group_lasso.analysis import input_feature_strength

    return np.asarray(input_feature_strength(model), dtype=float).reshape(image_shape)


def save_feature_figure(path, example, panels, title):
    """The paper's Figs. 5/6: an example input, then one strength image per method (white = dropped)."""
    plt = pyplot()
    n = 1 + len(panels)
    fig, axes = plt.subplots(1, n, figsize=(2.4 * n, 3.1), squeeze=False)
    axes = axes[0]
    axes[0].imshow(example, cmap="gray_r")
    axes[0].set_title("example input", fontsize=9)
    for ax, (name, image, kept) in zip(axes[1:], panels):
        ax.imshow(image, cmap="gray_r", vmin=0)
        ax.set_title(f"{name}\n{kept} features kept", fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fit_recording_warnings(model, data, batch_size, epochs, callbacks=()):
    """``model.fit`` on ``data["x_train"], data["y_train"]`` (shuffled), every warning that mentions a budget
    recorded and said; returns ``(History.history as floats, wall seconds, those warnings)``."""
    import time
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        history = model.fit(data["x_train"], data["y_train"], batch_size=batch_size, epochs=epochs, shuffle=True,
                            verbose=0, callbacks=list(callbacks))
        wall = time.perf_counter() - start
    messages = [str(w.message) for w in caught if "budget" in str(w.message).lower()]
    for message in messages:
        say(f"    warning: {message}")
    return {k: [float(v) for v in values] for k, values in history.history.items()}, wall, messages


def flops_ratio(model, threshold):
    """FLOPs after / before as ``sparsity_report`` counts them at ``threshold``."""
    from keras_group_lasso import sparsity_report

    report = sparsity_report(model, threshold)
    return report.flops_after / report.flops_before


def magnitude_pruned(dense, kernels, max_flops, steps=12):
    """Magnitude pruning of units at a FLOP target: ``(pruned copy, share, its FLOPs ratio)``.

    ``kernels``: variables of ``dense`` whose rows (axis 0) are the units' outgoing weights (a head's slice of an
    attention output kernel, a neuron's row of a down projection). In each, the weakest ``share`` of rows (smallest
    L2 norm) is zeroed, the least share (by bisection) whose FLOPs meet ``max_flops``; ``prune_model(dense, 0.0)``
    then removes exactly those, and ``dense`` gets its weights back."""
    import keras

    from keras_group_lasso import prune_model

    values = {v.path: keras.ops.convert_to_numpy(v) for v in kernels}
    norms = {path: np.sqrt(np.sum(w.reshape(w.shape[0], -1) ** 2, axis=1)) for path, w in values.items()}

    def zeroed(share):
        for variable in kernels:
            w = values[variable.path].copy()
            w[np.argsort(norms[variable.path])[: round(share * w.shape[0])]] = 0.0
            variable.assign(w)
        return flops_ratio(dense, 0.0)  # counted as prune_model(dense, 0.0) below cuts

    low, high = 0.0, 1.0
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (low, middle) if zeroed(middle) <= max_flops else (middle, high)
    ratio = zeroed(high)
    small = prune_model(dense, 0.0)  # only what was zeroed goes
    for variable in kernels:  # the dense model as it was
        variable.assign(values[variable.path])
    return small, high, ratio
