"""The RESULTS.md and table helpers of benchmarks/ (the benchmarks themselves are not run here)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is not installed

from benchmarks import common, overhead, peers_cnn, run_all  # noqa: E402


def test_write_section_appends_then_replaces_in_place(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\nintro\n")
    common.write_section("a", "First", "one", path=path)
    common.write_section("b", "Second", "two", path=path)
    common.write_section("a", "First", "uno $1 \\1", path=path)
    text = path.read_text()
    assert text.startswith("# Results\n\nintro\n")
    assert text.count("<!-- BEGIN a -->") == 1 and "one" not in text
    assert "uno $1 \\1" in text  # replacement text is taken literally
    assert text.index("## First") < text.index("## Second")


def test_mean_std_and_markdown_table():
    assert common.mean_std([0.5]) == "0.5"
    assert common.mean_std([1.0, 3.0], digits=2) == "2.00 ± 1.41"
    assert common.mean_std([0.9, 0.95], digits=1, scale=100) == "92.5 ± 3.5"
    table = common.markdown_table(["a", "b"], [[1, 2]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | 2 |"]


def test_run_all_passes_quick_and_seeds_to_the_paper_benchmarks():
    command = run_all.command_for("digits", quick=False, seeds=5)
    assert command[1].endswith("digits_sweep.py") and command[-2:] == ["--seeds", "5"]
    assert run_all.command_for("digits", quick=True, seeds=5)[-1] == "--quick"


def test_run_all_knows_every_benchmark_script_and_each_takes_quick():
    scripts = {p.name for p in Path(run_all.HERE).glob("*.py")} - {"__init__.py", "common.py", "run_all.py"}
    listed = {entry[0] for entry in run_all.BENCHMARKS.values()}
    assert listed | set(run_all.APART) == scripts and not listed & set(run_all.APART)
    for name in run_all.BENCHMARKS:
        assert run_all.command_for(name, quick=True)[-1] == "--quick", name
    assert run_all.command_for("vit", seeds=2)[-2:] == ["--seeds", "2"]
    assert "--seeds" not in run_all.command_for("step-cost", seeds=2)  # a timing, not seeds


def test_run_all_runs_every_overhead_comparison_through_one_harness():
    for name, kind in (("penalty-overhead", "penalty"), ("proximal-overhead", "proximal"),
                       ("monitor-overhead", "monitor"), ("cnn-overhead", "cnn")):
        command = run_all.command_for(name, quick=True)
        assert Path(command[1]).name == "overhead.py" and command[2:] == [kind, "--quick"]


def test_overhead_ratios_carry_their_spread_and_are_flagged_within_the_noise():
    assert overhead.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0)
    assert overhead.spread([2.0]) == (2.0, 0.0)
    samples = {
        "L2": {"wall": [1.0, 1.0, 1.0, 1.0], "cpu": [2.0, 2.1, 1.9, 2.0]},
        "SGL": {"wall": [1.5, 1.5, 1.5, 1.5], "cpu": [2.02, 2.5, 1.6, 2.0]},
    }
    assert overhead.ratio_cell(samples, "SGL", "L2", "wall") == "1.500x"  # no spread: a clean effect
    assert overhead.ratio_cell(samples, "SGL", "L2", "cpu").startswith("1.005x (noise ")  # IQR 12 % >> 0.5 %
    rows = overhead.table(samples, "L2").splitlines()
    assert rows[2].startswith("| L2 | 1.000 ± 0.000 |") and rows[3].startswith("| SGL | 1.500 ± 0.000 |")


def test_cli_bench_runs_the_script_with_quick_and_seeds(monkeypatch):
    import subprocess

    from keras_group_lasso import cli

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda command, cwd: calls.append((command, cwd)) or 0)
    assert cli.main(["bench", "digits", "--quick", "--seeds", "2"]) == 0
    (command, cwd), = calls
    assert command[0] == sys.executable
    assert Path(command[1]) == Path(cwd) / "benchmarks" / "digits_sweep.py"
    assert command[2:] == ["--quick", "--seeds", "2"]
    calls.clear()
    assert cli.main(["bench", "all"]) == 0
    assert Path(calls[0][0][1]).name == "run_all.py" and calls[0][0][2:] == []


def test_positive_int_refuses_zero_and_words():
    import argparse

    import pytest

    assert common.positive_int("3") == 3
    for text in ("0", "-1", "two", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"must be an integer >= 1; received '{text}'"):
            common.positive_int(text)


def test_seeds_zero_is_refused_before_any_training_or_writing(monkeypatch, capsys):
    import pytest

    from benchmarks import digits_sweep, fashion_table, peers_digits

    def no_work(*args, **kwargs):
        raise AssertionError("nothing may run or be written for bad arguments")

    monkeypatch.setattr(common, "staged", no_work)
    monkeypatch.setattr(common, "write_section", no_work)
    for main, argv in (
        (digits_sweep.main, ["--seeds", "0"]),
        (digits_sweep.main, ["--epochs", "0"]),
        (fashion_table.main, ["--seeds", "0"]),
        (peers_digits.main, ["--seeds", "0"]),
        (run_all.main, ["--seeds", "0"]),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert f"error: argument {argv[0]}: must be an integer >= 1; received '0'" in capsys.readouterr().err


def test_one_harness_parses_the_common_arguments_and_writes_a_run_once(tmp_path, monkeypatch, capsys):
    import json

    import numpy as np

    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Results\n\n## Index of every experiment\n\n### `benchmarks/zeta.py`\n\n| experiment |"
                          " what | command | date | machine | files |\n|---|---|---|---|---|---|\n| z | ... |\n\n"
                          "<!-- BEGIN findings -->\n## What the numbers say\n<!-- END findings -->\n")
    monkeypatch.setattr(common, "RESULTS_MD", results_md)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(common, "HERE", tmp_path)
    parser = common.arguments("A benchmark.\n\nMore.", seeds=3, quick="one seed")
    parser.add_argument("--epochs", type=common.positive_int, default=2)
    assert parser.description == "A benchmark."
    with pytest.raises(SystemExit):
        parser.parse_args(["--seeds", "0"])
    assert "--seeds: must be an integer >= 1; received '0'" in capsys.readouterr().err

    run = common.Run("bench", parser.parse_args(["--seeds", "2"]))
    run.script = "bench.py"
    assert run.seeds == [0, 1] and run.out == tmp_path / "results" and run.elapsed >= 0
    run.path(".png").parent.mkdir(parents=True)
    run.path(".png").write_bytes(b"figure")
    records = [{"seed": s, "accuracy": np.float32(0.5), "widths": np.array([3, 4])} for s in run.seeds]
    path = run.publish("Title", "| a |\n|---|\n| 1 |", records, notes=["2 epochs"], dense_macs=np.int64(7))
    assert path == tmp_path / "results" / "bench.md"
    text = path.read_text()
    assert text.startswith("# Title\n\n- Command: `") and "- Seeds: 0, 1\n- 2 epochs\n\n| a |" in text
    payload = json.loads((tmp_path / "results" / "bench.json").read_text())
    assert payload["records"][1] == {"seed": 1, "accuracy": 0.5, "widths": [3, 4]} and payload["dense_macs"] == 7
    assert payload["args"] == {"seeds": 2, "quick": False, "out_name": None, "epochs": 2}
    markdown = results_md.read_text()
    assert "<!-- BEGIN bench -->\n## Title\n\n" + text.split("\n\n", 1)[1] in markdown  # the same text
    index = markdown[: markdown.index("<!-- BEGIN findings -->")]
    assert index.index("### `benchmarks/bench.py`") < index.index("### `benchmarks/zeta.py`")  # alphabetical
    (row,) = [line for line in index.splitlines() if line.startswith("| bench")]
    assert row.startswith("| bench (seeds 0, 1) | Title; section below | `KERAS_BACKEND=")
    assert row.endswith("| [bench.md](results/bench.md), [bench.json](results/bench.json), [bench.png](results/bench.png) |")

    run.publish("Title", "again", records, summary="a | summary")  # a rerun replaces its row, nothing else
    index = results_md.read_text()[: results_md.read_text().index("<!-- BEGIN findings -->")]
    assert [line for line in index.splitlines() if line.startswith("| bench")][0].startswith(
        "| bench (seeds 0, 1) | a \\| summary; section below |")
    assert index.count("| bench") == 1 and "| z | ... |" in index

    quick = common.Run("bench", parser.parse_args(["--quick", "--out-name", "mine"]))
    assert quick.seeds == [0] and quick.out == tmp_path / "out" and quick.path(".png") == tmp_path / "out" / "mine.png"
    before = results_md.read_text()
    quick.publish("Title", "body", [])
    assert (tmp_path / "out" / "mine.md").exists() and results_md.read_text() == before
    common.Run("other", parser.parse_args([])).publish("T", "body", [], section="digits")
    common.Run("apart", parser.parse_args([])).publish("T", "body", [], section=False)
    markdown = results_md.read_text()
    assert "<!-- BEGIN digits -->" in markdown and "<!-- BEGIN apart -->" not in markdown
    assert "| apart (seeds 0, 1, 2) | T |" in markdown

    # a figure under a name of its own is listed too; the .md's links point next to it, the section's to results/
    named = common.Run("named", parser.parse_args(["--seeds", "1"]))
    named.file("named_features.png").write_bytes(b"figure")
    named.publish("N", "![pixels](results/named_features.png)", [])
    assert "![pixels](named_features.png)" in (tmp_path / "results" / "named.md").read_text()
    markdown = results_md.read_text()
    assert "![pixels](results/named_features.png)" in markdown
    assert "[named_features.png](results/named_features.png) |" in markdown
    # a run written elsewhere (a trial: --output x.md) leaves RESULTS.md alone
    elsewhere = common.Run("bench", parser.parse_args([]), output=tmp_path / "trial" / "mine.md")
    assert (elsewhere.out, elsewhere.name, elsewhere.writes_results_md) == (tmp_path / "trial", "mine", False)
    elsewhere.publish("T", "body", [])
    assert (tmp_path / "trial" / "mine.json").exists() and results_md.read_text() == markdown


def test_staged_results_replace_the_old_ones_only_when_the_run_succeeds(tmp_path):
    import pytest

    out = tmp_path / "results"
    out.mkdir()
    (out / "sweep.png").write_text("committed figure")
    (out / "sweep.json").write_text("committed numbers")
    with pytest.raises(KeyError):
        with common.staged(out) as stage:
            (stage / "sweep.png").write_text("new figure")
            raise KeyError("example")  # the crash of a run with no seeds, after its first figure
    assert (out / "sweep.png").read_text() == "committed figure"
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json", "sweep.png"]  # no leftovers
    with common.staged(out) as stage:
        (stage / "sweep.png").write_text("new figure")
        (stage / "sweep.json").write_text("new numbers")
    assert (out / "sweep.png").read_text() == "new figure" and (out / "sweep.json").read_text() == "new numbers"
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json", "sweep.png"]
    common.write_text_atomically(out / "sweep.json", "again")
    assert (out / "sweep.json").read_text() == "again"


def test_cli_bench_refuses_zero_seeds_before_starting_a_script(monkeypatch, capsys):
    import subprocess

    import pytest

    from keras_group_lasso import cli

    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("no benchmark may start"))
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "digits", "--seeds", "0"])
    assert info.value.code == 2
    assert "keras-group-lasso bench: error: argument --seeds: must be an integer >= 1; received '0'" in (
        capsys.readouterr().err
    )


def test_step_cost_counts_the_opcodes_of_an_optimized_hlo_module_and_the_matmul_flops():
    from benchmarks import step_cost

    text = "\n".join([
        "HloModule jit_step, is_scheduled=true",
        "",
        "%fused_computation (param_0: f32[4,3]) -> f32[4,3] {",
        "  %param_0 = f32[4,3]{1,0} parameter(0)",
        "  ROOT %negate = f32[4,3]{1,0} negate(%param_0)",
        "}",
        "",
        "ENTRY %main.7 (w: f32[4,3], s: s32[]) -> (f32[4,3], s32[]) {",
        "  %w = f32[4,3]{1,0} parameter(0), metadata={op_name=\"state[0][0]\"}",
        "  %s = s32[] parameter(1)",
        "  %copy = f32[4,3]{1,0} copy(%w)",
        "  %fusion = f32[4,3]{1,0} fusion(%copy), kind=kLoop, calls=%fused_computation",
        "  ROOT %tuple = (f32[4,3]{1,0}, s32[]) tuple(%fusion, %s)",
        "}",
    ])
    everything, entry = step_cost.hlo_counts(text)
    assert entry == {"parameter": 2, "copy": 1, "fusion": 1, "tuple": 1}
    assert everything == {"parameter": 3, "copy": 1, "fusion": 1, "tuple": 1, "negate": 1}
    forward, backward = step_cost.matmul_flops("mlp", 400)
    assert forward == 2 * 400 * (784 * 400 + 400 * 300 + 300 * 100 + 100 * 10)
    assert backward == forward + 2 * 400 * (400 * 300 + 300 * 100 + 100 * 10)  # no input gradient for layer 1


def test_inference_latency_reports_the_speedup_raw_and_above_the_floor():
    from benchmarks import inference_latency as latency

    us = {"empty": 100e-6, "dense": 300e-6, "pruned": 150e-6}
    wall = {(path, name): [us[name]] * 4 for path in latency.PATHS for name in latency.MODELS}
    cpu = {key: [v[0]] for key, v in wall.items()}
    _, speedup, medians = latency.tables(wall, cpu)
    row = speedup.splitlines()[2]
    assert row.startswith("| SavedModel | 100.0 | 300.0 | 150.0 | 2.00x | 4.00x | 67 % |")
    assert medians["compiled"] == (100.0, 300.0, 150.0)


def test_deploy_keeps_the_vgg_by_default_and_writes_a_modern_network_apart():
    from benchmarks import deploy

    vgg = deploy.parse_args([])
    assert (vgg.network, vgg.train, vgg.epochs, vgg.settle) == ("vgg", 12000, 3, 0.4)
    assert Path(vgg.output).parts[-2:] == ("results", "deploy.md")
    modern = deploy.parse_args(["--network", "mobilenetv2", "--quick"])
    assert modern.settle is None and (modern.train, modern.epochs) == (2000, 1)  # None: the library's default
    assert Path(modern.output).parts[-2:] == ("out", "deploy_mobilenetv2.md")


def test_the_peers_picture_reads_a_log_and_a_json_and_draws_every_seed(tmp_path):
    pytest.importorskip("matplotlib")
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    records = peers_cnn.read_records([results / "peers_cnn_16-32-64.log", results / "peers_cnn_16-32-64_s2.json"])
    methods = {"keras_dense", "keras_budget", "keras_budget_ft", "tp_l1", "tp_group_sl"}
    assert sorted((r["method"], r["seed"]) for r in records) == sorted((m, s) for m in methods for s in range(3))
    budget = {r["seed"]: r["test_accuracy"] for r in records if r["method"] == "keras_budget"}
    assert budget == {0: 0.8586, 1: 0.8626, 2: 0.857}  # RESULTS.md's row: 85.86 / 86.26 / 85.70
    path = peers_cnn.plot(records, peers_cnn.macs(peers_cnn.filter_counts(), [peers_cnn.UNITS]), tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_magnitude_pruning_meets_its_flop_target_and_leaves_the_dense_model_as_it_was():
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu", name="hidden"),
                              keras.layers.Dense(3, name="out")])
    before = [np.array(w) for w in model.get_weights()]
    out = model.get_layer("out").kernel  # its rows: the hidden units' outgoing weights
    small, share, ratio = common.magnitude_pruned(model, [out], 0.5)
    assert ratio <= 0.5 and 0 < share < 1
    assert small.get_layer("hidden").units == 16 - round(share * 16)
    kept = np.sort(np.argsort(np.linalg.norm(before[2], axis=1))[round(share * 16):])  # the strongest rows stay
    np.testing.assert_array_equal(small.get_layer("out").get_weights()[0], before[2][kept])
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)


def test_the_language_model_benchmark_merges_the_seeds_of_runs_made_alike_and_refuses_others(tmp_path, monkeypatch,
                                                                                              capsys):
    """``gemma_lm.py --merge``: the records of two result files (seed 0; seeds 1 and 2, the same arguments) in one
    table, what their own numbers give over the three seeds; files run with other arguments are refused."""
    from benchmarks import gemma_lm

    results = Path(common.RESULTS_DIR)
    monkeypatch.setattr(common, "RESULTS_MD", tmp_path / "RESULTS.md")
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    for name in ("HIDDEN", "HEAD_DIM", "NEURONS", "BUDGET", "COSINE"):  # main() sets them from the files' arguments
        monkeypatch.setattr(gemma_lm, name, getattr(gemma_lm, name))
    parts = [str(results / "gemma_lm_h128.json"), str(results / "gemma_lm_h128_s12.json")]
    assert gemma_lm.main(["--merge", *parts, "--out-name", "merged"]) == 0
    text = (tmp_path / "results" / "merged.md").read_text()
    assert "- Seeds: 0, 1, 2\n" in text and "hidden 128" in text
    assert "| `SparsityBudget(max_flops=0.4)`, `prune_model`, no fine-tuning | 6 | 4.557 ± 0.071 | 7.4 ± 1.9 |" in text
    assert "| gemma_lm_h128" not in (tmp_path / "RESULTS.md").read_text() and "merged" in (
        tmp_path / "RESULTS.md").read_text()
    with pytest.raises(SystemExit):
        gemma_lm.main(["--merge", parts[0], str(results / "gemma_lm_h128_12ep_cos.json"), "--out-name", "mixed"])
    assert "--merge: the files were run with other arguments" in capsys.readouterr().err
    assert not (tmp_path / "results" / "mixed.md").exists()
