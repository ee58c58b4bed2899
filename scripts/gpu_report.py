#!/usr/bin/env python3
"""The compact report of a GPU check (scripts/gpu_check.sh), meant to be committed as it is.

    gpu_report.py tests LOGS       -> markdown from the gtest XML, lists and logs of each run
    gpu_report.py sanitizer LOGS   -> markdown from compute-sanitizer's logs
    gpu_report.py bench LOGS       -> markdown from fogo_bench's JSON and torch_muon_step's text
    gpu_report.py train LOGS       -> markdown from the trainers' and the eager reference's logs
    gpu_report.py all LOGS DIR     -> the four into DIR/tests.md, sanitizer.md, bench.md, train.md

Each writes to stdout. Counts come from the gtest XML (typed and parameterised tests included,
child processes' output never counted), checked against `--gtest_list_tests`, so that a binary that
crashed or was killed shows as such, with the test it was running. Standard library only: it runs
on the GPU machine's bare python3.
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

# --------------------------------------------------------------------------------------------
# Tests


def listed_tests(text):
    """Full names from `--gtest_list_tests` output ("Suite." lines, then indented names)."""
    names, suite = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip().rstrip(".")
        elif suite is not None:
            names.append(f"{suite}.{line.split('#')[0].strip()}")
    return names


def xml_results(path):
    """{full name: (outcome, message)} from a gtest XML file; None when missing or unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    results = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        failures = case.findall("failure") + case.findall("error")
        skipped = case.find("skipped")
        if failures:
            message = "\n".join(f.get("message") or f.text or "" for f in failures)
            results[name] = ("failed", message)
        elif skipped is not None or case.get("result") == "skipped":
            message = (skipped.get("message") if skipped is not None else "") or ""
            results[name] = ("skipped", message)
        elif case.get("status") == "notrun" or case.get("result") == "suppressed":
            results[name] = ("not run", "disabled")
        else:
            results[name] = ("passed", "")
    return results


PYTEST_LINE = re.compile(r"^(\S+::\S+)(?: (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b)?")
PYTEST_OUTCOME = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "failed",
                  "SKIPPED": "skipped", "XFAIL": "skipped"}


def log_outcomes(text):
    """{full name: outcome} from gtest's console output or `pytest -v`'s, and the test that
    started last without ending (what a crashed or killed run was running), or None."""
    outcomes, running = {}, None
    for line in text.splitlines():
        m = re.match(r"\[ +(RUN|OK|FAILED|SKIPPED) +\] (\S+)", line)
        if m:
            tag, name = m.groups()
            if tag == "RUN":
                running = name
            else:
                outcomes[name] = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[tag]
                if name == running:
                    running = None
            continue
        m = PYTEST_LINE.match(line)
        if m:  # pytest -v prints the test's id when it starts and its outcome when it ends
            name, tag = m.groups()
            if tag:
                outcomes[name] = PYTEST_OUTCOME[tag]
                running = None if running == name else running
            else:
                running = name
    return outcomes, running


def exit_meaning(code):
    """What gpu_check.sh's exit status of a run says (timeout's 124, signals as 128 + n)."""
    known = {"124": "killed at its time budget", "137": "killed (SIGKILL)", "134": "aborted (SIGABRT)",
             "136": "SIGFPE", "139": "segmentation fault", "143": "terminated (SIGTERM)",
             "222": "not started: no time left"}
    return known.get(code, f"exit {code}")


CUDA_SKIP = re.compile(r"cuda|\bGPU\b", re.I)


def first_lines(message, n):
    lines = [line.rstrip() for line in message.strip().splitlines() if line.strip()]
    return lines[:n]


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def report_tests(logs):
    """runs.tsv: one line per binary run: name, exit code, seconds (the XML, log and list files
    are LOGS/<name>.xml, .log, .list)."""
    runs, not_run = [], []
    for line in (read(os.path.join(logs, "runs.tsv")) or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[1] == "not run":
            # A run gpu_check.sh did not start, and why (a 4th column): never a failure.
            not_run.append((parts[0], parts[3] if len(parts) > 3 else "not run"))
        elif len(parts) >= 3:
            runs.append((parts[0], parts[1], parts[2]))
    out = ["# Tests", ""]
    if not runs and not not_run:
        return "\n".join(out + ["No test runs recorded (LOGS/runs.tsv missing or empty).", ""])
    rows, failed, skipped, totals = [], [], [], dict(passed=0, failed=0, skipped=0, missing=0)
    # Shards of one binary (name-<k>) list the same tests and each run a part: what never ran is
    # counted over the binary, not per shard.
    groups = {}
    for name, code, seconds in runs:
        groups.setdefault(re.sub(r"-\d+$", "", name), []).append(name)
    ran_in_group, listed_in_group = {}, {}
    for name, code, seconds in runs:
        base = os.path.join(logs, name)
        listed = listed_tests(read(base + ".list") or "")
        results = xml_results(base + ".xml")
        log = read(base + ".log") or ""
        notes = []
        if results is None:
            outcomes, running = log_outcomes(log)
            results = {n: (o, "") for n, o in outcomes.items()}
            notes.append(f"no XML: {exit_meaning(code)}" +
                         (f" while running {running}" if running else ""))
            if running and name == "python_tests" and code == "124":
                # pytest killed at the test step's end (gpu_check runs it last, with what the
                # C++ tests left): the test it was running is out of budget, not failed.
                results[running] = ("not run", "out of budget")
                notes[-1] = f"not run: out of budget while running {running}"
                not_run.append((name, f"{running} and the tests after it: not run: out of "
                                      "budget (pytest killed at the test step's end)"))
            elif running:
                results[running] = ("failed", f"crashed or killed while running "
                                              f"({exit_meaning(code)})")
        counts = dict(passed=0, failed=0, skipped=0)
        for test, (outcome, message) in sorted(results.items()):
            if outcome in counts:
                counts[outcome] += 1
            if outcome == "failed":
                failed.append((name, test, message))
            elif outcome == "skipped":
                skipped.append((name, test, message))
        group = re.sub(r"-\d+$", "", name)
        ran_in_group.setdefault(group, set()).update(results)
        listed_in_group.setdefault(group, listed)
        if code not in ("0",) and not counts["failed"] and not (
                name == "python_tests" and code == "124"):
            notes.append(f"{exit_meaning(code)} with no failed test")
        for k in counts:
            totals[k] += counts[k]
        rows.append(f"| {name} | {code} | {seconds} | {len(listed)} | {len(results)} | "
                    f"{counts['passed']} | {counts['failed']} | {counts['skipped']} | "
                    f"{'; '.join(notes)} |")
    never_ran = []
    for group, members in groups.items():
        missing = [t for t in listed_in_group.get(group, []) if t not in ran_in_group[group]]
        totals["missing"] += len(missing)
        if missing:
            never_ran.append(f"- {group} ({len(members)} run(s)): {len(missing)} listed test(s) "
                             f"never ran, first {missing[0]}")
    cuda_skips = [t for _, t, m in skipped if CUDA_SKIP.search(t) or CUDA_SKIP.search(m)]
    out.append(f"**{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} "
               f"skipped, {totals['missing']} listed but never run.**")
    out.append("")
    for name, why in not_run:
        label = "Python tests" if name == "python_tests" else name
        out += [f"**{label}: {why}** (not counted above, not a failure)", ""]
    out.append(f"CUDA tests skipped: {len(cuda_skips)} (named cuda or skipped for want of CUDA or "
               "a GPU; on a GPU machine each is a failure of the setup)")
    out += ["", "| binary (shard) | exit | s | listed | run | passed | failed | skipped | notes |",
            "|---|---|---|---|---|---|---|---|---|"] + rows + [""]
    if never_ran:
        out += ["Listed but never run (a crash, a kill or a timeout):", ""] + never_ran + [""]
    out.append(f"## Failed ({len(failed)})")
    out.append("")
    for name, test, message in failed:
        lines = first_lines(message, 4)
        where = lines[0] if lines else "(no message)"
        out.append(f"- `{test}` ({name}): {where}")
        out += [f"    > {line[:300]}" for line in lines[1:4]]
    out += ["", f"## Skipped ({len(skipped)})", ""]
    for name, test, message in skipped:
        reason = " ".join(first_lines(message, 3)) or "(no reason given)"
        out.append(f"- `{test}` ({name}): {reason[:300]}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# compute-sanitizer

HEADER = re.compile(r"^=+ (?P<text>\S.*)$")
CONTINUATION = re.compile(r"^=+ {2,}(?P<text>\S.*)$")
NOT_A_RECORD = ("COMPUTE-SANITIZER", "CUDA-MEMCHECK", "ERROR SUMMARY", "RACECHECK SUMMARY",
                "LEAK SUMMARY", "Program hit", "Saved host backtrace", "Target application returned",
                "Host Frame", "Device Frame")
WHERE = [
    re.compile(r"at (?P<fn>.+?)\+0x[0-9a-f]+ in (?P<loc>\S+:\d+)"),
    re.compile(r"at 0x[0-9a-f]+ in (?P<loc>[^:\s]+:\d+):(?P<fn>.+)"),
    re.compile(r"at (?P<fn>.+?)\+0x[0-9a-f]+"),
]
# fogo's own kernels: their names (namespace fogo) or sources (cuda/*.cu, *.cuh, *.cpp of this
# project, not ATen's native/cuda/ or anything else under a PyTorch or CUDA tree).
OURS_NAME = re.compile(r"\bfogo::")
OURS_FILE = re.compile(r"(^|/)cuda/[A-Za-z_0-9]+\.(cu|cuh|cpp):")
NOT_OURS_FILE = re.compile(r"aten/|ATen/|/c10/|/torch/|pytorch|/cuda-[0-9.]+/|/targets/x86_64")
# Whose a library kernel is, by its name or source.
LIBRARIES = [
    ("ATen (PyTorch)", re.compile(r"\bat::|\bc10::|ATen/|aten/|pytorch")),
    ("cuBLAS/cuBLASLt", re.compile(r"cublas|cutlass|xmma|nvjet|gemm|gemv|splitK|\bdot_kernel|"
                                   r"scal_kernel|axpy|trsm|syrk|Kernel2", re.I)),
    ("NCCL", re.compile(r"nccl", re.I)),
    ("cuDNN", re.compile(r"cudnn", re.I)),
]


def is_ours(fn, loc):
    if OURS_NAME.search(fn):
        return True
    return bool(OURS_FILE.search(loc + ":") and not NOT_OURS_FILE.search(loc))


def library_of(fn, loc):
    for name, pattern in LIBRARIES:
        if pattern.search(fn) or pattern.search(loc):
            return name
    return "another library (neither fogo's, ATen's, cuBLAS's nor NCCL's)"


def where_of(text):
    for pattern in WHERE:
        m = pattern.search(text)
        if m:
            fn = m.group("fn").strip()
            loc = m.groupdict().get("loc") or "(no line information)"
            return fn, loc
    return None, None


def sanitizer_records(text):
    """Each report of a sanitizer log: (kind, kernel, location, count, lines)."""
    records, current = [], None
    for line in text.splitlines():
        cont = CONTINUATION.match(line)
        head = HEADER.match(line)
        if cont and current is not None:
            current.append(cont.group("text"))
        elif head and not cont:
            body = head.group("text")
            current = None
            if not body.startswith(NOT_A_RECORD):
                current = [body]
                records.append(current)
        else:
            current = None
    out = []
    for lines in records:
        kind = re.sub(r"0x[0-9a-f]+", "0x…", lines[0])
        kind = re.sub(r" at .*", "", kind)
        fn, loc = None, None
        for line in lines:
            fn, loc = where_of(line)
            if fn:
                break
        count = 1
        for line in lines:
            m = re.search(r"\[(\d+) hazards?\]", line)
            if m:
                count = int(m.group(1))
        out.append((kind, fn or "(unknown kernel)", loc or "(unknown location)", count, lines))
    return out


SANITIZER_LOG = re.compile(r"sanitize-(?P<run>.+?)(?:-(?P<shard>\d+))?\.log$")


def report_sanitizer(logs):
    """One section per tool and pass (its shards, sanitize-TOOL-PASS-K.log, merged), each report
    deduplicated by kernel and source line, fogo's kernels apart from library code. An exit status
    beside a log (.exit) says whether the run finished."""
    out = ["# compute-sanitizer", ""]
    entries = sorted(os.listdir(logs)) if os.path.isdir(logs) else []
    runs = {}
    for entry in entries:
        m = SANITIZER_LOG.match(entry)
        if m:
            runs.setdefault(m.group("run"), []).append(entry)
    for entry in entries:  # a shard that was never started has an exit status and no log
        m = re.match(r"(sanitize-.+)\.exit$", entry)
        if m and not os.path.exists(os.path.join(logs, m.group(1) + ".log")):
            run = SANITIZER_LOG.match(m.group(1) + ".log").group("run")
            runs.setdefault(run, []).append(m.group(1) + ".log")
    ours_total, theirs_total, libraries = 0, 0, {}
    for run, shard_logs in sorted(runs.items()):
        summaries, ok, failed, unfinished, grouped = [], 0, 0, [], {}
        for entry in sorted(shard_logs):
            text = read(os.path.join(logs, entry)) or ""
            code = (read(os.path.join(logs, entry[:-4] + ".exit")) or "").strip()
            shard_summaries = [line.strip("= ").strip() for line in text.splitlines()
                               if "SUMMARY" in line]
            summaries += shard_summaries
            if code == "222":
                unfinished.append(f"{entry[:-4]}: not started (no time left)")
            elif code in ("124", "137") or (text and not shard_summaries):
                why = exit_meaning(code) if code else "no summary printed"
                unfinished.append(f"{entry[:-4]}: did not finish ({why})")
            ok += len(re.findall(r"^\[       OK \]", text, re.M))
            failed += len(re.findall(r"^\[  FAILED  \] \S+ \(", text, re.M))
            for kind, fn, loc, count, lines in sanitizer_records(text):
                key = (kind, fn, loc)
                grouped.setdefault(key, [0, 0, lines])
                grouped[key][0] += 1
                grouped[key][1] += count
        out.append(f"## {run} ({len(shard_logs)} process(es))")
        out.append("")
        out.append(f"- summary: {'; '.join(summaries) or 'none printed (the run did not finish)'}")
        out.append(f"- tests: {ok} ok, {failed} failed under the tool")
        for line in unfinished:
            out.append(f"- {line}")
        ours = [(k, v) for k, v in grouped.items() if is_ours(k[1], k[2])]
        theirs = [(k, v) for k, v in grouped.items() if not is_ours(k[1], k[2])]
        ours_total += len(ours)
        theirs_total += len(theirs)
        out.append(f"- distinct reports: {len(grouped)} ({len(ours)} in fogo's kernels)")
        if ours:
            out += ["", "### in fogo's kernels", ""]
            for (kind, fn, loc), (n, hazards, lines) in ours:
                out.append(f"- **{kind}** ×{n} ({hazards} hazard(s)/error(s)) in `{fn[:200]}` "
                           f"at `{loc}`")
                out += [f"    > {line[:240]}" for line in lines[1:3]]
        if theirs:
            out += ["", "### in library code (not fogo's kernels: they do not fail the step)", ""]
            for (kind, fn, loc), (n, hazards, lines) in theirs:
                lib = library_of(fn, loc)
                libraries[lib] = libraries.get(lib, 0) + 1
                out.append(f"- {lib}: **{kind}** ×{n} ({hazards} hazard(s)/error(s)) in "
                           f"`{fn[:200]}` at `{loc}`")
                out += [f"    > {line[:240]}" for line in lines[1:3]]
        out.append("")
    if not runs:
        out.append("No sanitizer logs (the sanitize step did not run).")
    out.append(f"Reports in fogo's kernels: {ours_total}.")
    named = ", ".join(f"{name} {n}" for name, n in sorted(libraries.items()))
    out.append(f"Reports in library code: {theirs_total}{f' ({named})' if named else ''}.")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Benchmarks and training


def report_bench(logs):
    out = ["# Step benchmarks", ""]
    try:
        with open(os.path.join(logs, "bench.json")) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return "\n".join(out + [f"No benchmark results ({e}).", ""])
    ctx = data.get("context", {})
    out.append(f"fogo_bench on {ctx.get('host_name', '?')}, {ctx.get('date', '?')}; "
               "median of the repetitions; counters as fogo_bench reports them.")
    out += ["", "| benchmark | median | counters |", "|---|---|---|"]
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        skip = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads",
                "iterations", "real_time", "cpu_time", "time_unit", "aggregate_name",
                "aggregate_unit", "family_index", "per_family_instance_index", "label"}
        counters = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in b.items() if k not in skip)
        out.append(f"| {b.get('run_name', b.get('name'))} | {b.get('real_time', 0):.3f} "
                   f"{b.get('time_unit', '')} | {counters} |")
    torch_muon = read(os.path.join(logs, "torch_muon.txt"))
    if torch_muon:
        out += ["", "torch.optim.Muon (bench/torch_muon_step.py):", "", "```"]
        out += torch_muon.strip().splitlines()[-20:] + ["```"]
    return "\n".join(out) + "\n"


def report_train(logs):
    out = ["# Training throughput", "", "| run | result |", "|---|---|"]
    entries = sorted(os.listdir(logs)) if os.path.isdir(logs) else []
    for entry in entries:
        m = re.match(r"(gpt2-.+|resnet-.+)\.log$", entry)
        if not m or entry == "gpt2-eager.log":
            continue
        text = read(os.path.join(logs, entry)) or ""
        lines = [line.strip() for line in text.splitlines()]
        steady = [line for line in lines if line.startswith("steady state")]
        rate = [line for line in lines if "images/s" in line]
        errors = [line for line in lines if re.search(r"\berror\b|Error|terminate", line)]
        result = (steady[-1] if steady else rate[-1] if rate else
                  f"FAILED: {errors[0][:300]}" if errors else "no result line")
        out.append(f"| {m.group(1)} | {result} |")
    eager = read(os.path.join(logs, "gpt2-eager.log"))
    if eager is not None:
        line = [line for line in eager.splitlines() if line.startswith("gpt2_eager ")]
        out.append(f"| eager PyTorch (bench/gpt2_eager.py) | "
                   f"{line[-1] if line else 'no result line'} |")
    return "\n".join(out) + "\n"


KINDS = {"tests": report_tests, "sanitizer": report_sanitizer, "bench": report_bench,
         "train": report_train}


def main(argv):
    if len(argv) == 4 and argv[1] == "all":
        # Every part at once into DIR/<kind>.md (one interpreter start: gpu_check.sh rewrites the
        # report after every step); a part that fails says so in its file.
        for kind, report in KINDS.items():
            try:
                text = report(argv[2])
            except Exception as e:  # noqa: BLE001 - the other parts must still be written
                text = f"(gpu_report.py {kind} failed: {type(e).__name__}: {e})\n"
            with open(os.path.join(argv[3], kind + ".md"), "w") as f:
                f.write(text)
        return
    if len(argv) != 3 or argv[1] not in KINDS:
        sys.exit(f"usage: {argv[0]} {{{','.join(KINDS)}}} LOGS | all LOGS DIR")
    sys.stdout.write(KINDS[argv[1]](argv[2]))


if __name__ == "__main__":
    main(sys.argv)
