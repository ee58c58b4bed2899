"""bench/targets.py on a small fixture (testdata/targets_*): every row of issue 26's table, its
figure computed from the fixture's numbers by hand, and missing inputs reading "not measured"."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import targets  # noqa: E402


def data(name):
    return os.path.join(HERE, "testdata", name)


FULL = ["--bench", data("targets_bench.json"), "--torch-muon", data("targets_torch_muon.txt"),
        "--gpt2", "adamw=" + data("targets_gpt2-adamw.log"),
        "--gpt2", "muon=" + data("targets_gpt2-muon.log"),
        "--gpt2", "fogo=" + data("targets_gpt2-fogo.log"),
        "--gpt2-eager", data("targets_gpt2-eager.log")]


def run(args):
    out = subprocess.run([sys.executable, os.path.join(HERE, "targets.py"), *args],
                         capture_output=True, text=True, check=True)
    rows = [line.strip("|").split(" | ") for line in out.stdout.splitlines()[2:]]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}, out


def test_bench_json_medians_ignore_means_failures_and_convert_units():
    medians = targets.load_bench(data("targets_bench.json"))
    assert medians["BM_Step_FOGO/0/1/0"] == 10.0  # the median aggregate, not the mean (30)
    assert medians["BM_Step_MuonGram/1/1/0"] == 5.0  # median of 4, 5, 9 ms given in us
    assert "BM_Step_AdamW/0/1/0" not in medians  # error_occurred


def test_bench_names_with_the_real_time_suffix_fogo_bench_gives_them(tmp_path):
    # fogo_bench registers every benchmark with UseRealTime(): its JSON names them
    # "BM_Step_FOGO/0/1/0/real_time" (one repetition: no aggregates).
    (tmp_path / "bench.json").write_text(
        '{"benchmarks": [{"name": "BM_Step_FOGO/0/1/0/real_time", '
        '"run_name": "BM_Step_FOGO/0/1/0/real_time", "run_type": "iteration", '
        '"real_time": 12.0, "time_unit": "ms"}, {"name": "BM_Stage_FOGO/0/1/0/1/real_time", '
        '"run_name": "BM_Stage_FOGO/0/1/0/1/real_time", "run_type": "iteration", '
        '"real_time": 9.0, "time_unit": "ms"}]}')
    medians = targets.load_bench(str(tmp_path / "bench.json"))
    assert medians == {"BM_Step_FOGO/0/1/0": 12.0, "BM_Stage_FOGO/0/1/0/1": 9.0}


def test_every_row_from_the_fixture():
    rows, _ = run(FULL)
    assert len(rows) == 9
    # (now, measured, target, met?) per row; measured worked out by hand from the fixture.
    assert rows["fogo::Muon step, GPT-2 small, best form"] == [
        "6.68 ms", "4.00 ms", "<= 4.5 ms (NS >= 50% of bf16 peak)", "yes"]  # min(8, 6, 6.5, 4)
    assert rows["FOGO / fogo::Muon, GPT-2 small"] == ["1.47", "1.25", "<= 1.3", "yes"]  # 10 / 8
    assert rows["FOGO work outside NS"] == ["28%", "20%", "<= 15%", "no"]  # (10 - 8) / 10
    # 9/10, 2.5/5, 4/8, 3.5/5: all <= 1, but Muon on ResNet-18 0.7 > 0.6.
    assert rows["cuda_graph / eager, every optimizer and set"][1:] == [
        "0.50-0.90", "<= 1.0 everywhere, <= 0.6 on ResNet-18", "no"]
    # 10.2/min(10, 9.9), 5/min(5, 12), 6/min(8, 6.5), 6/min(5, 5).
    assert rows["Auto / min(Plain, Gram), every optimizer and set"][1:] == [
        "0.92-1.20", "<= 1.05", "no"]
    assert rows["fogo::Muon / torch.optim.Muon, both sets"][1:] == [
        "0.40-0.50", "<= 0.35", "no"]  # 8 / 20, 5 / 10
    name = "GPT-2 124M training step, FOGO / AdamW (491,520 tokens/step)"
    assert rows[name] == ["not kept", "1.04", "<= 1.05", "yes"]
    name = "GPT-2 124M training step, FOGO / Muon (491,520 tokens/step)"
    assert rows[name] == ["not kept", "1.02", "<= 1.03", "yes"]  # 104 / 102
    assert rows["GPT-2 124M trainer tokens/s vs eager PyTorch (both AdamW)"][1:] == [
        "500,000 vs 490,000 tokens/s", ">= eager's", "yes"]


def test_missing_inputs_read_not_measured_and_exit_zero():
    rows, out = run([])
    assert len(rows) == 9
    for figure, (now, measured, target, met) in rows.items():
        assert measured == "not measured", figure
        assert met == "not measured", figure
        assert now and target
    rows, out = run(["--bench", data("no-such.json"), "--gpt2", "fogo=" + data("nope.log")])
    assert "cannot read" in out.stderr
    assert rows["FOGO / fogo::Muon, GPT-2 small"][1] == "not measured"


def test_partial_inputs_say_so():
    rows, _ = run(["--bench", data("targets_bench.json")])
    # The bench alone: the step rows are filled, the torch and trainer rows are not.
    assert rows["FOGO / fogo::Muon, GPT-2 small"][1] == "1.25"
    assert rows["fogo::Muon / torch.optim.Muon, both sets"][1:] == [
        "not measured", "<= 0.35", "not measured"]
    torch_only = os.path.join(HERE, "testdata", "targets_torch_muon.txt")
    rows, _ = run(["--bench", data("targets_bench.json"), "--torch-muon", torch_only])
    assert rows["fogo::Muon / torch.optim.Muon, both sets"][1] == "0.40-0.50"


def test_bad_gpt2_argument_is_an_error():
    with pytest.raises(subprocess.CalledProcessError):
        run(["--gpt2", "fogo"])
