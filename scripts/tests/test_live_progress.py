"""scripts/live_progress.py, the main job's live lines (scripts/run.sh), on logs shaped like the
trainers' (common/progress.h's line, written by stand-in processes that then end)."""
import importlib.util
import io
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("live_progress",
                                              os.path.join(HERE, "..", "live_progress.py"))
live_progress = importlib.util.module_from_spec(spec)
spec.loader.exec_module(live_progress)

# A resnet_train log as it reads in a file (common/progress.h's example line; the header and an
# evaluation note around it), and a gpt2 one (no epochs; tokens).
RESNET_LOG = """run runs/main.parts/fogo/fogo-seed0: class-imbalanced, 1 task(s), 168 steps
  fogo, NS auto: fp32 (cpu, ...): stem (1, C 96, d 128, lr 0.006)
[fogo s0] epoch 3/4  step 120/168  loss 0.4321  acc 87.50%  2310 samples/s  ETA 1m12s
  eval epoch 3.00: acc 80.10%  rare 41.20%  non-rare 90.00%  rare forgetting 1.30
"""
GPT2_LOG = "[muon] step 40/100  loss 3.2100  1234 tokens/s  ETA 5s  lr 6.00e-04  |g| 0.812\n"


def test_the_last_progress_line_gives_epoch_step_loss_and_eta():
    f = live_progress.last_progress(RESNET_LOG + RESNET_LOG.replace("step 120", "step 121"))
    assert f == {"label": "fogo s0", "epoch": "3/4", "step": "121/168", "loss": "0.4321",
                 "eta": "1m12s"}
    g = live_progress.last_progress(GPT2_LOG)
    assert (g["label"], g["epoch"], g["step"], g["loss"], g["eta"]) == ("muon", None, "40/100",
                                                                       "3.2100", "5s")
    # Redrawn in place (a terminal's carriage returns) reads the same.
    assert live_progress.last_progress("\r" + GPT2_LOG.strip() + "\r")["step"] == "40/100"
    assert live_progress.last_progress("run x: 168 steps\n") is None


def test_status_lines():
    f = live_progress.last_progress(RESNET_LOG)
    assert (live_progress.status_line("fogo", f, True, 5.0) ==
            "fogo: [fogo s0]  epoch 3/4  step 120/168  loss 0.4321  ETA 1m12s")
    assert live_progress.status_line("muon", None, True, 5.0) == "muon: starting"
    assert live_progress.status_line("adam", f, False, 212.4) == "adam: finished after 212 s"


# A stand-in trainer: writes `steps` progress lines into `log`, 0.1 s apart, then exits.
WRITER = textwrap.dedent("""
    import sys, time
    log, label, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(log, "w") as f:
        f.write("run x: class-imbalanced, 1 task(s), %d steps\\n" % steps)
        for s in range(1, steps + 1):
            f.write("[%s] epoch 1/1  step %d/%d  loss %.4f  acc 50.00%%  99 samples/s  ETA %ds\\n"
                    % (label, s, steps, 1.0 / s, steps - s))
            f.flush()
            time.sleep(0.1)
""")


def run_display(tmp_path, tty):
    procs, logs = [], []
    for name, steps in (("fogo", 4), ("muon", 8)):
        log = tmp_path / f"{name}.log"
        procs.append(subprocess.Popen([sys.executable, "-c", WRITER, str(log), name + " s0",
                                       str(steps)]))
        logs.append(f"{name}={log}")
    out = io.StringIO()
    pids = ",".join(str(p.pid) for p in procs)
    assert live_progress.main(["--pids", pids, "--interval", "0.05", "--tty", tty] + logs, out) == 0
    assert all(p.wait() == 0 for p in procs)
    return out.getvalue()


def test_plain_lines_outside_a_terminal(tmp_path):
    text = run_display(tmp_path, "off")
    assert "\x1b" not in text and "\r" not in text
    lines = text.splitlines()
    assert any("fogo: [fogo s0]  epoch 1/1  step" in l and "ETA" in l for l in lines)
    assert any("muon: [muon s0]  epoch 1/1  step" in l for l in lines)
    # Each update is one line per process, stamped with the seconds since the start; the last
    # block says both processes finished.
    assert all(l.startswith("[") and " s] " in l for l in lines)
    assert "fogo: finished after" in lines[-2] and "muon: finished after" in lines[-1]


def test_lines_redrawn_in_place_on_a_terminal(tmp_path):
    text = run_display(tmp_path, "on")
    # Every block after the first moves the cursor up to its first line and clears each line.
    blocks = text.split("\x1b[2F")
    assert len(blocks) > 2
    assert all(b.count("\x1b[2K") == 2 for b in blocks)
    final = [l.replace("\x1b[2K", "") for l in blocks[-1].splitlines()]
    assert final[0].startswith("fogo: finished after") and final[1].startswith("muon: finished")
    assert any("step 4/4" in b or "step 3/4" in b for b in blocks)


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        live_progress.main(["--pids", "1,2", "fogo=a.log"])
    assert e.value.code == 2
    assert "one NAME=LOG per process id" in capsys.readouterr().err
