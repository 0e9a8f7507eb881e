"""`minidl-exercise check NAME`: builds a learner's exercises/NAME/ against the already built library and runs the
exercise's criteria, each in its own mpiexec at each of its world sizes, and says which invariant broke.

The grader program is tests/exercises/grade_NAME.cpp (its criteria, their world sizes and repeats: `--list`). The
build compiles it against the reference (dist/naive/); here the same compile line from the build's
compile_commands.json is run with the learner's folder in place of dist/naive/, and linked with the build's own
link line (build.ninja), so nothing of the library is rebuilt.

Each run gets MINIDL_COLLECTIVE_TIMEOUT (4 s), so a hang is named by the watchdog within seconds (which rank waits
in which call on which peer, placed at a ring step by the grader's CALL lines); RUN_TIMEOUT_S more stops a run
that hangs anyway. Statuses: passed, failed, timeout, blocked (not run: the code did not compile). Exit codes: 0
every criterion passed, 1 not, 2 bad usage.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import exercise_regions as er

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(os.environ.get("MINIDL_BUILD_DIR", os.path.join(ROOT, "build")))
COLLECTIVE_TIMEOUT_S = 4
RUN_TIMEOUT_S = 40
COMPILER_LINES = 20
EXCERPT_LINES = 30
OUTPUT_CAP = 200_000  # characters of a run's output kept (a flood is cut, and says so)

WATCHDOG = re.compile(r"minidl: collective timeout on rank (\d+): group (\S+) \(ranks [^)]*\) sequence (\d+) (\w+) "
                      r"(\w+) x (\d+)(?: \((\w+)\))?(?: peer (\d+))? has not completed after ([\d.]+) s")
CALL = re.compile(r"^\[rank (\d+)\] CALL (.+) numel=(\d+) p2p_base=(\d+)$")
RESULT = re.compile(r"^\[rank (\d+)\] RESULT (passed|failed)(?:: (.*))?$")
SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+) \(([^)]+)\)")


def fail_usage(message):
    print(f"minidl-exercise: {message}", file=sys.stderr)
    sys.exit(2)


def build_lines(name, learner_dir, out_dir):
    """(compile argv, link argv) for the grader of `name` against learner_dir, from the build tree."""
    source = os.path.join(ROOT, "tests", "exercises", f"grade_{name}.cpp")
    commands = os.path.join(BUILD, "compile_commands.json")
    if not os.path.isfile(commands) or not os.path.isfile(os.path.join(BUILD, "libminidl.a")):
        fail_usage(f"no built library in {BUILD} (expected compile_commands.json and libminidl.a): build minidl "
                   "first (scripts/build.sh), or point MINIDL_BUILD_DIR at its build tree")
    entry = next((e for e in json.load(open(commands)) if os.path.abspath(e["file"]) == source), None)
    if entry is None:
        fail_usage(f"{BUILD} has no compile line for {os.path.relpath(source, ROOT)}: configure the build again "
                   "(cmake -S . -B build)")
    argv = shlex.split(entry["command"])
    naive = "-I" + os.path.join(ROOT, "dist", "naive")
    if naive not in argv:
        fail_usage(f"the compile line of {os.path.relpath(source, ROOT)} has no {naive} to replace")
    argv[argv.index(naive)] = "-I" + os.path.abspath(learner_dir)
    obj = os.path.join(out_dir, f"grade_{name}.o")
    argv[argv.index("-o") + 1] = obj
    argv = [a for a in argv if a not in ("-O3", "-O2")] + ["-O0"]  # the library is optimised; this file is not hot
    # The link line of the reference grader's target, from build.ninja: the compiler, FLAGS, LINK_FLAGS, the
    # object, LINK_PATH and LINK_LIBRARIES, run in the build directory (its paths are relative to it).
    ninja = open(os.path.join(BUILD, "build.ninja"), encoding="utf-8").read()
    m = re.search(rf"^build tests/exercises/grade_{name}: \S+ .*?\n((?:  \S+ = .*\n)+)", ninja, re.M)
    if not m:
        fail_usage(f"{BUILD}/build.ninja has no target tests/exercises/grade_{name}: configure the build again")
    var = dict(re.findall(r"^  (\S+) = (.*)$", m.group(1), re.M))
    binary = os.path.join(out_dir, f"grade_{name}")
    link = ([argv[0]] + shlex.split(var.get("FLAGS", "")) + shlex.split(var.get("LINK_FLAGS", "")) + [obj, "-o", binary]
            + shlex.split(var.get("LINK_PATH", "")) + shlex.split(var.get("LINK_LIBRARIES", "")))
    return argv, entry["directory"], link, binary


def criteria_of(binary):
    out = subprocess.run([binary, "--list"], capture_output=True, text=True, timeout=30)
    rows = []
    for line in out.stdout.splitlines():
        cid, ranks, repeats, given, what = line.split("\t", 4)
        rows.append((cid, [int(n) for n in ranks.split(",")], int(repeats), tuple(g for g in given.split(",") if g),
                     what))
    return rows


def variant(name, files, learner_dir, given, out_dir):
    """A folder holding the learner's files with the regions `given` ("ddp.h:1", ...) taken from the reference, or
    None when a file's markers no longer match the reference's (then the learner's files are graded whole)."""
    where = os.path.join(out_dir, "given-" + "-".join(g.replace(".h:", "") for g in given))
    os.makedirs(where, exist_ok=True)
    for f in files:
        text = open(os.path.join(learner_dir, f), encoding="utf-8").read()
        indices = [int(g.split(":")[1]) for g in given if g.split(":")[0] == f]
        if indices:
            reference = open(os.path.join(ROOT, "dist", "naive", f), encoding="utf-8").read()
            try:
                text = er.with_reference_regions(text, reference, f, indices)
            except er.RegionError:
                text = None
            if text is None:
                return None
        open(os.path.join(where, f), "w", encoding="utf-8").write(text)
    return where


STATEMENT = re.compile(r"^(for|if|while|switch|return|MINIDL_|else|do)\b|^[:,]")  # or a constructor's initialisers


def signature_of(lines, first):
    """The signature (joined, one line) of the function around line `first`: the nearest line above it, indented
    less than the region, that opens a parameter list and is no statement, to the line ending in '{'."""
    region_indent = len(lines[first]) - len(lines[first].lstrip())
    for i in range(first - 1, -1, -1):
        line, text = lines[i], lines[i].split("//")[0].strip()
        if (not text or len(line) - len(line.lstrip()) >= region_indent or "(" not in text
                or STATEMENT.match(text) or text.endswith(";")):
            continue
        parts, j = [line.strip()], i
        while not lines[j].rstrip().endswith("{") and j + 1 < first:
            j += 1
            parts.append(lines[j].strip())
        return " ".join(parts)
    return None


def changed_signatures(files, learner_dir):
    """The reference's signatures (of each function that holds a region) missing from the learner's files: what the
    grader calls, printed when the learner's code does not compile."""
    missing = []
    for f in files:
        reference = open(os.path.join(ROOT, "dist", "naive", f), encoding="utf-8").read().split("\n")
        mine = " ".join(open(os.path.join(learner_dir, f), encoding="utf-8").read().split())
        for r in er.parse(f, "\n".join(reference)):
            sig = signature_of(reference, r.first)
            if sig and " ".join(sig.split()) not in mine and sig not in missing:
                missing.append(sig)
    return missing


def build_all(name, folders):
    """{folder: (binary, None) or (None, the compiler's first lines)}: the grader against each folder's files, the
    compiles two at a time (the variants of one check are independent)."""
    jobs, out = [], {}
    for folder, out_dir in folders:
        compile_argv, directory, link_argv, binary = build_lines(name, folder, out_dir)
        jobs.append((folder, compile_argv, directory, link_argv, binary))
    for i in range(0, len(jobs), 2):
        running = [(j, subprocess.Popen(j[1], cwd=j[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                   for j in jobs[i:i + 2]]
        for (folder, _, _, link_argv, binary), p in running:
            text = p.communicate()[0]
            if p.returncode == 0:
                linked = subprocess.run(link_argv, cwd=BUILD, capture_output=True, text=True)
                text, code = linked.stderr or linked.stdout, linked.returncode
            else:
                code = p.returncode
            out[folder] = (binary, None) if code == 0 else (None, "\n".join(text.splitlines()[:COMPILER_LINES]))
    return out


def build(name, learner_dir, out_dir):
    """(binary, None) or (None, the compiler's first lines) for the grader against the files in learner_dir."""
    return build_all(name, [(learner_dir, out_dir)])[learner_dir]


def ring_place(call, numel, k, np):
    """Where the k-th send/recv of a call into the learner's ring falls, if each step is one send and one recv."""
    step = (k - 1) // 2
    phase = ""
    if call.startswith("ring_all_reduce"):
        phase = f" (reduce-scatter step {step})" if step < np - 1 else f" (all-gather step {step - (np - 1)})"
    return f"ring step {step}{phase} of {call} of {numel} elements"


def hang_reason(output, np, debug_dir, ring=True):
    """Who waits on whom: each rank's open calls from its flight recorder dump (the watchdog writes them), placed at
    a ring step by the rank's last CALL line; the watchdog's own lines when there are no dumps."""
    last_call = {}
    for line in output.splitlines():
        m = CALL.match(line)
        if m:
            last_call[int(m.group(1))] = (m.group(2), int(m.group(3)), int(m.group(4)))
    expired = {int(m.group(1)): m for m in WATCHDOG.finditer(output)}
    if not expired:
        return None
    waits, peers, unmatched = [], [], []
    for rank in range(np):
        try:
            dump = json.load(open(os.path.join(debug_dir, f"flight-rank{rank}.json")))
        except (OSError, ValueError):
            dump = None
        opened = [e for e in (dump or {}).get("entries", []) if e["state"] == "enqueued"]
        if not opened and rank in expired:
            m = expired[rank]
            opened = [{"group": m.group(2), "seq": int(m.group(3)), "op": m.group(4), "count": int(m.group(6)),
                       "peer": int(m.group(8)) if m.group(8) else -1}]
        if not opened:
            continue
        # A blocked recv is what a rank waits on; an open send is a message nobody has taken.
        recvs = [e for e in opened if e["op"] == "recv"]
        main = recvs[0] if recvs else opened[0]
        prep = {"recv": "from", "send": "to"}.get(main["op"], "with")
        text = f"rank {rank} waits in {main['op']} of {main['count']} elements"
        if main["peer"] >= 0:
            text += f" {prep} rank {main['peer']}"
        if main["group"] == "exercise" and main["op"] in ("send", "recv") and rank in last_call:
            call, numel, base = last_call[rank]
            text += " at " + ring_place(call, numel, main["seq"] - base, np)
        elif main["group"] != "exercise":
            text += f" (the grader's own {main['op']}: an earlier call left the ranks out of step)"
        unsent = [e for e in opened if e["op"] == "send" and e is not main]
        if unsent:
            text += f", its send to rank {unsent[0]['peer']} not taken either"
            if main["op"] == "recv":
                unmatched.append(f"rank {rank}'s send of {unsent[0]['count']} elements to rank {unsent[0]['peer']}")
        waits.append(text)
        peers.append((main["op"], rank, main["peer"]))
    if ring and len(peers) == np and all(op == "recv" and peer == (r + 1) % np for op, r, peer in peers):
        waits.append("every rank receives from its right neighbour, who sends to the right too: a ring receives "
                     "from the left, r - 1")
    elif not ring and unmatched:
        waits.append("unmatched: " + ", ".join(unmatched) + " (a send and a receive between the same ranks that do "
                     "not meet: a tag, or an order, the other side does not expect)")
    return "hang: " + "; ".join(waits) + f" (named by the watchdog after {COLLECTIVE_TIMEOUT_S} s)"


def capped(text):
    if len(text) <= OUTPUT_CAP:
        return text
    return text[:OUTPUT_CAP // 2] + f"\n[... {len(text) - OUTPUT_CAP} characters cut ...]\n" + text[-OUTPUT_CAP // 2:]


def excerpt(text):
    lines = [l for l in text.splitlines() if not CALL.match(l)]
    if len(lines) > EXCERPT_LINES:
        lines = lines[:EXCERPT_LINES // 2] + [f"[... {len(lines) - EXCERPT_LINES} lines ...]"] + lines[-EXCERPT_LINES // 2:]
    return "\n".join(lines)


def run_criterion(binary, cid, np, debug_dir, ring=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", MINIDL_COLLECTIVE_TIMEOUT=str(COLLECTIVE_TIMEOUT_S),
               MINIDL_DEBUG_DIR=debug_dir, MINIDL_CHECK_COLLECTIVES="1", MINIDL_FLIGHT_RECORDER_SIZE="1000000",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpiexec", "-n", str(np), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [binary, "--criterion", cid]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=RUN_TIMEOUT_S)
        output, rc, timed_out = p.stdout.decode(errors="replace"), p.returncode, False
    except subprocess.TimeoutExpired as e:
        output, rc, timed_out = (e.stdout or b"").decode(errors="replace"), None, True
    seconds = time.monotonic() - t0
    output = capped(output)
    results = [RESULT.match(l) for l in output.splitlines()]
    results = [m for m in results if m]
    failures = [f"rank {m.group(1)}: {m.group(3)}".replace("an error: --check-collectives:", "mismatched messages:")
                for m in results if m.group(2) == "failed"]
    hang = hang_reason(output, np, debug_dir, ring)
    sig = SIGNAL.search(output)
    if rc == 0 and sum(m.group(2) == "passed" for m in results) == np:
        status, reason = "passed", ""
    elif failures:
        status, reason = "failed", failures[0]
    elif hang:
        status, reason = "timeout", hang
    elif sig:
        status, reason = "failed", f"rank {sig.group(1)} died of signal {sig.group(2)} ({sig.group(3)})"
    elif timed_out:
        status, reason = "timeout", f"still running after {RUN_TIMEOUT_S} s (no rank was named: a loop that never ends?)"
    else:
        status, reason = "failed", f"the run ended with exit code {rc} and no result line"
    return {"id": f"{cid}.np{np}", "status": status, "seconds": round(seconds, 2), "reason": reason,
            "log": excerpt(output) if status != "passed" else ""}


def print_table(name, rows):
    width = max(len(r["id"]) for r in rows)
    print(f"exercise {name}")
    print(f"  {'criterion':<{width}}  {'status':<8} {'seconds':>7}  reason")
    for r in rows:
        reason = r["reason"].split(" (MINIDL_TODO: ")[0]  # the hint is in the log and the JSON
        reason = reason if len(reason) <= 400 else reason[:400] + " ..."
        print(f"  {r['id']:<{width}}  {r['status']:<8} {r['seconds']:>7.2f}  {reason}")
    given = {}
    for r in rows:
        if r.get("given"):
            given.setdefault(", ".join(r["given"]), []).append(r["id"].rsplit(".np", 1)[0])
    for regions, ids in given.items():
        print(f"  (with the reference's {regions}, so that a bug there fails nothing else: "
              f"{', '.join(dict.fromkeys(ids))})")
    graded = [r for r in rows if r["id"] != "compiles"]
    passed = sum(r["status"] == "passed" for r in graded)
    print(f"  score {passed}/{len(graded)} (compiles: {rows[0]['status']})")


def check(name, files, learner_dir, json_path, only=None, repeat=1):
    if not os.path.isdir(learner_dir):
        fail_usage(f"{learner_dir} does not exist: 'minidl-exercise start {name}' writes it")
    missing = [f for f in files if not os.path.isfile(os.path.join(learner_dir, f))]
    if missing:
        fail_usage(f"{learner_dir} lacks {', '.join(missing)} (expected {', '.join(files)}; "
                   f"'minidl-exercise reset {name}' writes them again)")
    if not os.path.isfile(os.path.join(ROOT, "tests", "exercises", f"grade_{name}.cpp")):
        fail_usage(f"exercise {name} has no grader yet (tests/exercises/grade_{name}.cpp)")
    out_dir = os.path.join(BUILD, "exercises", name)
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    t0 = time.monotonic()
    # The variants the criteria need (the learner's files with the reference's regions they do not grade), known
    # from the reference grader's list, are built beside the learner's own.
    reference = os.path.join(BUILD, "tests", "exercises", f"grade_{name}")
    binaries, folders = {}, [(learner_dir, out_dir)]
    listed_by_reference = criteria_of(reference) if os.path.isfile(reference) else []
    for given in dict.fromkeys(c[3] for c in listed_by_reference if c[3] and (not only or c[0] == only)):
        folder = variant(name, files, learner_dir, given, out_dir)
        if folder:
            folders.append((folder, folder))
            binaries[given] = folder
    built = build_all(name, folders)
    binary, first = built[learner_dir]
    binaries = {given: built[folder][0] for given, folder in binaries.items()}
    seconds = round(time.monotonic() - t0, 2)
    if binary is None:
        changed = changed_signatures(files, learner_dir)
        errors = [l for l in first.splitlines() if "error" in l] or first.splitlines() or ["(no output)"]
        reason = ("a signature changed: expected " + "; ".join(f"`{c}`" for c in changed) if changed else
                  "does not compile: " + errors[0])
        rows.append({"id": "compiles", "status": "failed", "seconds": seconds, "reason": reason, "log": first})
        reference = os.path.join(BUILD, "tests", "exercises", f"grade_{name}")
        listed = criteria_of(reference) if os.path.isfile(reference) else []
        for cid, ranks, _, _, _ in listed:
            for np in ranks:
                rows.append({"id": f"{cid}.np{np}", "status": "blocked", "seconds": 0.0,
                             "reason": "not run: the exercise does not compile", "log": ""})
    else:
        rows.append({"id": "compiles", "status": "passed", "seconds": seconds, "reason": "", "log": ""})
        debug_root = tempfile.mkdtemp(prefix=f"minidl-exercise-{name}-")
        binaries[()] = binary
        try:
            listed = criteria_of(binary)
            if only and only not in [c[0] for c in listed]:
                fail_usage(f"exercise {name} has no criterion '{only}'; its criteria: {', '.join(c[0] for c in listed)}")
            for cid, ranks, _, given, _ in listed:
                if only and cid != only:
                    continue
                if given not in binaries:  # the learner's files with the reference's regions `given`
                    folder = variant(name, files, learner_dir, given, out_dir)
                    binaries[given] = build(name, folder, os.path.join(folder))[0] if folder else binary
                todo = None
                for np in ranks:
                    if todo:  # a MINIDL_TODO throws at every world size: said once, not run again
                        rows.append(dict(todo, id=f"{cid}.np{np}", seconds=0.0, log="",
                                         reason=todo["reason"] + f" (not run at {np} ranks: the same MINIDL_TODO)"))
                        continue
                    for attempt in range(repeat):  # the first failure of `repeat` runs, or the last pass
                        row = run_criterion(binaries[given] or binary, cid, np,
                                            os.path.join(debug_root, f"{cid}.np{np}.{attempt}"), name == "ring")
                        if row["status"] != "passed":
                            if repeat > 1:
                                row["reason"] += f" (run {attempt + 1} of {repeat})"
                            break
                    if given:
                        row["given"] = list(given)
                    rows.append(row)
                    if "not written yet" in row["reason"]:
                        todo = row
        finally:
            shutil.rmtree(debug_root, ignore_errors=True)
    print_table(name, rows)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"exercise": name, "criteria": rows}, f, indent=1)
    return 0 if all(r["status"] == "passed" for r in rows) else 1
