#!/usr/bin/env python3
"""One live progress line per training process, read from the processes' log files.

scripts/run.sh trains its optimizers as parallel processes, each writing into a log file. This
shows, for each, the last progress line the trainer wrote there (common/progress.h's
"[fogo s0] epoch 3/4  step 120/168  loss 0.4321 ... ETA 1m12s"), reduced to epoch, step, loss
and ETA, until every process has ended:

    live_progress.py --pids 101,102,103 fogo=runs/main.parts/fogo.log muon=... adam=...

On a terminal the lines are redrawn in place (ANSI cursor movement, every --interval seconds,
default 1); otherwise (a CI log, a pipe) they are printed as plain lines every --interval seconds
(default 30), so a log stays short. Each line ends as "finished after N s" when its process has
ended (whether it succeeded is for the caller, which waits for the process, to say).

The trainers write into a log (not a terminal) a progress line every 10 s at most, so a line here
changes at that pace. Standard library only: the script runs before anything is installed.
"""
import argparse
import os
import re
import shutil
import sys
import time

# The trainer's progress line (common/progress.cpp): "[label] [epoch e/E  ]step s[/S]  ...".
PROGRESS = re.compile(r"^\[(?P<label>[^\]]+)\] (?:epoch (?P<epoch>\d+(?:/\d+)?)\s+)?"
                      r"step (?P<step>\d+(?:/\d+)?)(?P<rest>.*)$")
LOSS = re.compile(r"\bloss (\S+)")
ETA = re.compile(r"\bETA (\S+)")
TAIL_BYTES = 64 * 1024  # a log's end holds its last progress line (the lines are ~120 bytes)


def last_progress(text):
    """The fields of the last progress line in `text` (a dict), or None when there is none."""
    for line in reversed(re.split(r"[\r\n]+", text)):
        m = PROGRESS.match(line.strip())
        if m:
            loss, eta = LOSS.search(m.group("rest")), ETA.search(m.group("rest"))
            return {"label": m.group("label"), "epoch": m.group("epoch"), "step": m.group("step"),
                    "loss": loss.group(1) if loss else None, "eta": eta.group(1) if eta else None}
    return None


def read_tail(path):
    """The last TAIL_BYTES of the file at `path` ("" while it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def alive(pid):
    """Whether process `pid` is running (a zombie, ended but not yet waited for, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def status_line(name, fields, running, elapsed):
    """What the display shows for one process."""
    if not running:
        return f"{name}: finished after {elapsed:.0f} s"
    if fields is None:
        return f"{name}: starting"
    parts = [f"[{fields['label']}]"]
    if fields["epoch"]:
        parts.append(f"epoch {fields['epoch']}")
    parts.append(f"step {fields['step']}")
    if fields["loss"]:
        parts.append(f"loss {fields['loss']}")
    if fields["eta"]:
        parts.append(f"ETA {fields['eta']}")
    return f"{name}: " + "  ".join(parts)


class Display:
    """Writes a block of lines: redrawn in place on a terminal, appended as plain lines otherwise."""

    def __init__(self, out, tty):
        self.out, self.tty, self.drawn = out, tty, 0

    def show(self, lines, elapsed):
        if not self.tty:
            stamp = f"[{elapsed:.0f} s]"
            self.out.write("".join(f"{stamp} {line}\n" for line in lines))
        else:
            width = max(20, shutil.get_terminal_size().columns - 1)  # no wrap: the count holds
            up = f"\x1b[{self.drawn}F" if self.drawn else ""  # to the first line of the block
            self.out.write(up + "".join(f"\x1b[2K{line[:width]}\n" for line in lines))
            self.drawn = len(lines)
        self.out.flush()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pids", required=True, help="comma-separated process ids, one per log")
    p.add_argument("--interval", type=float, default=None,
                   help="seconds between updates (default: 1 on a terminal, 30 otherwise)")
    p.add_argument("--tty", choices=["auto", "on", "off"], default="auto",
                   help="redraw in place (on), plain lines (off), or on when stdout is a terminal")
    p.add_argument("logs", nargs="+", metavar="NAME=LOG", help="a process's name and log file")
    args = p.parse_args(argv)
    args.pids = [int(x) for x in args.pids.split(",") if x]
    args.logs = [tuple(entry.split("=", 1)) for entry in args.logs]
    if any(len(entry) != 2 for entry in args.logs) or len(args.logs) != len(args.pids):
        p.error("give one NAME=LOG per process id")
    return args


def main(argv=None, out=sys.stdout):
    args = parse_args(argv)
    tty = out.isatty() if args.tty == "auto" else args.tty == "on"
    interval = args.interval if args.interval is not None else (1.0 if tty else 30.0)
    display, start = Display(out, tty), time.monotonic()
    ended = {}  # name -> seconds after start when its process was first seen ended
    while True:
        elapsed = time.monotonic() - start
        lines = []
        for (name, log), pid in zip(args.logs, args.pids):
            if name not in ended and not alive(pid):
                ended[name] = elapsed
            lines.append(status_line(name, last_progress(read_tail(log)), name not in ended,
                                     ended.get(name, elapsed)))
        display.show(lines, elapsed)
        if len(ended) == len(args.logs):
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
