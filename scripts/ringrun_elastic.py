"""ringrun's elastic mode (--max-restarts): run the job, and when it fails, check the hosts
again and relaunch it from its newest valid checkpoint on the ranks that remain.

ringrun itself (scripts/ringrun) parses the arguments, checks hosts and builds mpirun's command;
this module is the supervisor around those steps. Without --max-restarts ringrun exec()s mpirun
and none of this runs.

The policy, as torchrun's --max-restarts and Horovod elastic users expect it:
  - a launch uses the hosts that pass the preflight (a hostfile is read again before each
    launch, so a host added to it, or back up, rejoins), and the most ranks, up to -np and at
    least --min-np, that split the job's global batch (the trainer keeps the global batch and
    recomputes the per-rank batch when it resumes on another rank count);
  - a job that fails (a rank killed, a host lost, the watchdog's stall exit) is relaunched with
    --resume auto, at most --max-restarts times; a failure a relaunch cannot mend (bad flags or
    input, a diverged run) ends it at once, as does preemption;
  - SIGTERM, SIGUSR1 or SIGUSR2 to ringrun asks the job to checkpoint and stop (SIGUSR1 to
    mpirun, which forwards it to every rank); ringrun then exits 75, and the same command
    resumes. SIGINT is passed on and nothing is restarted.

The trainer is asked for its configuration (PROGRAM ARGS --print-config, run here), so that a
config file's values count too: the checkpoint directory, the batch, --reproducible's
micro-batch. Only the Python standard library is used.
"""

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

PROG = "ringrun"

# Exit codes of mnist_train (include/ringtrain/check.h) that a relaunch cannot change.
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_COMM = 4
EXIT_NON_FINITE = 5
EXIT_PREEMPTED = 75
FINAL_CODES = {
    EXIT_USAGE: "bad flags (exit 2): a relaunch would be refused the same way",
    EXIT_BAD_INPUT: "unusable input, checkpoint or configuration (exit 3): a relaunch would "
                    "meet it again",
    EXIT_NON_FINITE: "the training diverged (exit 5: NaN or Inf): a relaunch from the same "
                     "checkpoint would diverge again",
}
# ringrun's own exit when no launch is possible (no hosts, no rank count that fits).
EXIT_NO_LAYOUT = 1

# What mpirun and the ranks print when a job dies, turned into the cause ringrun logs.
KILLED_RE = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)"
                       r"(?: \(([^)]*)\))?")
EXIT_STATUS_RE = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n?\s*Exit code:\s*(\d+)")
DAEMON_LOST_RE = re.compile(r"lost communication with a remote daemon|daemon.*(?:failed|died|"
                            r"lost)|unable to reliably start one or more daemons|"
                            r"ORTE does not know how to route", re.IGNORECASE)
WATCHDOG_RE = re.compile(r"watchdog: .* made no progress")
ERROR_RE = re.compile(r"\[error\] (.*)")
PREEMPTED_RE = re.compile(r"preempted: .*every rank stopped after step (\d+)")
RESUMED_RE = re.compile(r"resuming from |step \d+/\d+ ")
# A line that shows the job trained (a step logged, a checkpoint written, a resume).
PROGRESS_RE = re.compile(r"resuming from |\] step \d+/\d+ |checkpoint: step \d+ written")


def say(message):
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


class ElasticError(Exception):
    """The job cannot be (re)launched as asked: a message and ringrun's exit status."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------- the trainer's configuration ----

def parse_toml_value(text):
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"'):
        try:
            return json.loads(text)
        except ValueError:
            return text.strip('"')
    if text.startswith("["):
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def program_config(program, args, timeout=60):
    """PROGRAM ARGS --print-config: the effective configuration as {flag: value} ('given' holds
    the flags that were set, by the command line or a config file)."""
    try:
        out = subprocess.run([program] + list(args) + ["--print-config"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ElasticError(f"--max-restarts: could not ask {program} for its configuration "
                           f"(--print-config): {e}", 2)
    if out.returncode != 0:
        last = (out.stderr.strip() or out.stdout.strip() or "no message").splitlines()[0]
        raise ElasticError(f"--max-restarts: {program} ARGS --print-config exited "
                           f"{out.returncode}: {last} (ringrun's restarts need a ringtrain "
                           f"trainer that reports its configuration, and flags it accepts)", 2)
    config, given = {}, set()
    for line in out.stdout.splitlines():
        commented = line.startswith("#")
        body = line[1:].strip() if commented else line.strip()
        key, eq, value = body.partition(" = ")
        if not eq or not re.fullmatch(r"[a-z0-9-]+", key):
            continue
        config[key] = parse_toml_value(value)
        if not commented:
            given.add(key)
    if "checkpoint-dir" not in config or "batch-size" not in config:
        raise ElasticError(f"--max-restarts: {program} --print-config did not list "
                           f"checkpoint-dir and batch-size: is it ringtrain's mnist_train?", 2)
    return config, given


def strip_flag(args, flag):
    """args without `flag VALUE` and `flag=VALUE`."""
    out, skip = [], False
    for word in args:
        if skip:
            skip = False
            continue
        if word == flag:
            skip = True
            continue
        if word.startswith(flag + "="):
            continue
        out.append(word)
    return out


class JobShape:
    """What a relaunch must keep: the global batch and the divisibility it imposes."""

    def __init__(self, config, given, args, max_np):
        strategy = config.get("strategy", "ring")
        if strategy not in ("ring", "local-sgd"):
            raise ElasticError(f"--max-restarts restarts --strategy ring and local-sgd jobs; "
                               f"this one is --strategy {strategy}", 2)
        self.checkpoint_dir = config.get("checkpoint-dir") or ""
        if not self.checkpoint_dir:
            raise ElasticError("--max-restarts needs the trainer's --checkpoint-dir DIR: a "
                               "restart resumes from the newest valid checkpoint there (add "
                               "--checkpoint-dir and a --checkpoint-every or --checkpoint-secs "
                               "to the program's flags)", 2)
        self.passes = int(config.get("accumulate-steps", 1) or 1)
        global_batch = int(config.get("global-batch-size", 0) or 0)
        on_command_line = any(a == "--batch-size" or a.startswith("--batch-size=") for a in args)
        if "batch-size" in given and not on_command_line:
            # A config file's batch-size cannot be taken out of a relaunch's flags, and the
            # trainer refuses it beside a --global-batch-size it does not match.
            raise ElasticError("--max-restarts: the trainer's config file sets batch-size (per "
                               "rank), which a relaunch on fewer ranks would change: set "
                               "global-batch-size there instead (or give --batch-size on the "
                               "command line)", 2)
        if global_batch > 0 and "batch-size" in given:
            per_rank = int(config["batch-size"])
            if per_rank * max_np * self.passes != global_batch:
                raise ElasticError(f"--batch-size {per_rank} x -np {max_np} ranks"
                                   f"{f' x {self.passes} passes' if self.passes > 1 else ''} is "
                                   f"not --global-batch-size {global_batch}: pass one of the "
                                   f"two", 2)
        self.batch_was_per_rank = global_batch == 0
        if global_batch == 0:
            # A per-rank batch (given or the default): the job's global batch is what the
            # first launch trains with, at -np ranks; a relaunch on fewer keeps it.
            global_batch = int(config["batch-size"]) * max_np * self.passes
        self.global_batch = global_batch
        self.reproducible = bool(config.get("reproducible", False))
        self.micro_batch = int(config.get("micro-batch", 0) or 0) if self.reproducible else 0

    def units(self):
        """What the ranks x passes must divide: micro-shards, or samples."""
        return self.global_batch // self.micro_batch if self.reproducible else self.global_batch

    def fits(self, ranks):
        return self.units() % (ranks * self.passes) == 0

    def describe(self):
        text = f"global batch {self.global_batch}"
        if self.reproducible:
            text += f" ({self.units()} micro-shards of --micro-batch {self.micro_batch})"
        if self.passes > 1:
            text += f", {self.passes} passes per step"
        return text

    def valid_counts(self, most):
        return [n for n in range(1, most + 1) if self.fits(n)]


def choose_layout(shape, hosts, max_np, min_np, oversubscribe=False):
    """The most ranks from min_np to max_np that the hosts' slots hold (any number up to max_np
    with oversubscribe) and the global batch splits, placed host by host in order:
    (np, [(host, ranks)]). Raises ElasticError."""
    slots = sum(s for _, s in hosts)
    most = max_np if oversubscribe else min(max_np, slots)
    for n in range(most, min_np - 1, -1):
        if n > slots and shape.fits(n):
            return n, list(hosts)  # every slot, and mpirun --oversubscribe places the rest
        if shape.fits(n):
            layout, left = [], n
            for host, s in hosts:
                if left == 0:
                    break
                take = min(s, left)
                layout.append((host, take))
                left -= take
            return n, layout
    if slots < min_np and not oversubscribe:
        raise ElasticError(f"{slots} slot(s) on the hosts that answered, fewer than --min-np "
                           f"{min_np}", EXIT_NO_LAYOUT)
    counts = ", ".join(map(str, shape.valid_counts(max_np))) or "none"
    raise ElasticError(f"no rank count from --min-np {min_np} to {most} splits the "
                       f"{shape.describe()} (rank counts up to -np {max_np} that do: {counts}); "
                       f"the global batch is kept across restarts, so the job cannot go on "
                       f"with these hosts", EXIT_NO_LAYOUT)


# ------------------------------------------------------------------ one launch ----

class Launch:
    """mpirun as a child: its output passed through line by line (and the last lines kept, to
    tell why it failed), signals from the supervisor passed on."""

    TAIL = 400

    def __init__(self, cmd, on_line):
        self.tail = collections.deque(maxlen=self.TAIL)
        self.lock = threading.Lock()
        # A session of its own: a signal to ringrun's process group (a terminal's ^C, a
        # `timeout`, a shell's job control) reaches ringrun alone, which passes on what the job
        # should get (SIGUSR1 for a stop: mpirun forwards it to the ranks; SIGTERM would make
        # mpirun kill them a second later).
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.started = time.monotonic()
        self.progressed = False
        self.threads = [threading.Thread(target=self.copy, args=(self.proc.stdout, sys.stdout,
                                                                 on_line), daemon=True),
                        threading.Thread(target=self.copy, args=(self.proc.stderr, sys.stderr,
                                                                 on_line), daemon=True)]
        for thread in self.threads:
            thread.start()

    def copy(self, source, sink, on_line):
        passing = True
        for raw in iter(source.readline, b""):
            if passing:
                try:
                    sink.buffer.write(raw)
                    sink.buffer.flush()
                except (OSError, ValueError):
                    passing = False  # our output is gone (a closed pipe): keep draining mpirun
            line = raw.decode("utf-8", "replace")
            with self.lock:
                self.tail.append(line)
            if not self.progressed and PROGRESS_RE.search(line):
                self.progressed = True
            on_line(self, line)

    def signal(self, number):
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(number)
            except ProcessLookupError:
                pass

    def wait(self):
        """mpirun's status, as a shell reports it (128 + N for a signal N)."""
        while True:
            try:
                status = self.proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
        # Whatever mpirun left of its session on this machine (ranks of an mpirun that was
        # killed) goes before anything is relaunched: no stale rank may write a checkpoint.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for thread in self.threads:
            thread.join(5)
        return 128 - status if status < 0 else status

    def output(self):
        with self.lock:
            return "".join(self.tail)


def failure_cause(status, output):
    """A line saying why the job ended, from mpirun's status and the job's last output."""
    found = KILLED_RE.search(output)
    if found:
        rank, node, number, name = found.groups()
        return (f"rank {rank} on {node} was killed by signal {number}"
                f"{f' ({name})' if name else ''} (exit {status})")
    if DAEMON_LOST_RE.search(output):
        line = next((l.strip() for l in output.splitlines() if DAEMON_LOST_RE.search(l)), "")
        return f"a host was lost: Open MPI lost a daemon ({line[:160]}) (exit {status})"
    found = WATCHDOG_RE.search(output)
    if found:
        return f"a stall ended by the watchdog ({found.group(0)[:200]}) (exit {status})"
    found = ERROR_RE.search(output)
    if found:
        return f"{found.group(1).strip()[:240]} (exit {status})"
    found = EXIT_STATUS_RE.search(output)
    if found:
        return f"rank {found.group(1)} exited with code {found.group(2)} (exit {status})"
    if status == EXIT_COMM:
        return "a communication failure (exit 4: a collective timed out or a peer failed)"
    if status > 128:
        return f"mpirun ended on signal {status - 128} (exit {status})"
    return f"the job exited with status {status}"


# ------------------------------------------------------------------ the supervisor ----

class Supervisor:
    """Launches, watches and relaunches. `hosts()` gives the current host list (re-reading a
    hostfile); `check(hosts)` runs the preflight: (fatal problems, {host: reason});
    `command(layout, np, args)` builds mpirun's argument list."""

    def __init__(self, *, program, args, max_np, min_np, max_restarts, hosts, check, command,
                 verbose, oversubscribe=False):
        self.max_np = max_np
        self.min_np = min_np
        self.max_restarts = max_restarts
        self.hosts = hosts
        self.check = check
        self.command = command
        self.verbose = verbose
        self.oversubscribe = oversubscribe
        config, given = program_config(program, args)
        self.shape = JobShape(config, given, args, max_np)
        # The global batch, never a per-rank one, from the first launch on: the same training
        # at -np ranks, and what a relaunch on fewer keeps.
        self.args = strip_flag(list(args), "--batch-size")
        if self.shape.batch_was_per_rank:
            self.args += ["--global-batch-size", str(self.shape.global_batch)]
        self.launch = None
        self.stop_signal = None
        self.interrupted = False
        self.failed_at = None
        self.stop_at = None
        self.resumed_reported = True

    # signals ---------------------------------------------------------------------------
    def on_stop(self, number, _frame):
        first = self.stop_signal is None
        now = time.monotonic()
        # GNU timeout (and some launchers) pass one TERM on twice, to the child and to its
        # group: a repeat within 2 s is the same request, not an order to hurry.
        if not first and now - self.stop_at < 2.0:
            return
        self.stop_signal = number
        self.stop_at = now
        if self.launch is None:
            return
        self.forward_stop(first)

    def forward_stop(self, first=True):
        number = self.stop_signal
        if first:
            say(f"signal {number} ({signal.Signals(number).name}): asking the job to checkpoint "
                f"and stop (SIGUSR1 to mpirun, which passes it to every rank); it will not be "
                f"restarted")
            # mpirun ends on a SIGUSR1 that comes before it has set up its handlers (the
            # default action): give a job that has just been started a second first.
            launch = self.launch
            wait = 1.0 - (time.monotonic() - launch.started)
            if wait > 0:
                threading.Timer(wait, launch.signal, [signal.SIGUSR1]).start()
            else:
                launch.signal(signal.SIGUSR1)
        else:
            say(f"signal {number} again: ending the job (SIGTERM to mpirun)")
            self.launch.signal(signal.SIGTERM)

    def on_interrupt(self, number, _frame):
        self.interrupted = True
        if self.launch is not None:
            self.launch.signal(number)

    def on_line(self, launch, line):
        if launch is not self.launch:
            return  # a late line of the job before
        if not self.resumed_reported and RESUMED_RE.search(line):
            self.resumed_reported = True
            say(f"training resumed {time.monotonic() - self.failed_at:.1f} s after the failure "
                f"ended the previous job")

    # one attempt -----------------------------------------------------------------------
    def layout(self):
        hosts = self.hosts()
        fatal, failed = self.check(hosts)
        if fatal:
            raise ElasticError("preflight failed:\n" + "\n".join(f"  {l}" for l in fatal), 1)
        for host, reason in failed.items():
            say(f"dropping {host}: {reason}")
        usable = [(h, s) for h, s in hosts if h not in failed]
        if not usable:
            raise ElasticError("no host passed the preflight", EXIT_NO_LAYOUT)
        return choose_layout(self.shape, usable, self.max_np, self.min_np, self.oversubscribe)

    def first_command(self):
        """mpirun's command for the first launch on every listed host (for --dry-run)."""
        np, layout = choose_layout(self.shape, self.hosts(), self.max_np, self.min_np,
                                   self.oversubscribe)
        return self.command(layout, np, self.args)

    def run(self):
        for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(number, self.on_stop)
        signal.signal(signal.SIGINT, self.on_interrupt)
        say(f"elastic: up to {self.max_restarts} restart(s), {self.min_np} to {self.max_np} "
            f"rank(s), {self.shape.describe()}, checkpoints in {self.shape.checkpoint_dir}")
        restarts, last_cause, last_status, quick_failures = 0, None, None, 0
        args = self.args
        while True:
            try:
                np, layout = self.layout()
            except ElasticError as e:
                if last_cause is not None:
                    say(f"cannot restart: {e}; the last failure: {last_cause}")
                    return last_status if last_status else e.code
                say(f"{e}; nothing was started")
                return e.code
            if self.stop_signal is not None or self.interrupted:
                say("stopped before the launch; the checkpoints in "
                    f"{self.shape.checkpoint_dir} are resumed by the same command")
                return EXIT_PREEMPTED if self.stop_signal is not None else 130
            per_rank = self.shape.global_batch // (np * self.shape.passes)
            where = ",".join(f"{h}:{n}" for h, n in layout)
            if restarts == 0:
                say(f"launch: np {np} on {where} (per-rank batch {per_rank})")
            else:
                say(f"restart {restarts} of {self.max_restarts}: np {np} on {where} (per-rank "
                    f"batch {per_rank}), resuming from the newest valid checkpoint in "
                    f"{self.shape.checkpoint_dir} (--resume auto)")
                self.resumed_reported = False
            cmd = self.command(layout, np, args)
            if self.verbose:
                say("run " + " ".join(cmd))
            launch = Launch(cmd, self.on_line)
            self.launch = launch
            # A signal that came while mpirun was being started found no launch to pass to.
            if self.stop_signal is not None:
                self.forward_stop()
            if self.interrupted:
                launch.signal(signal.SIGINT)
            status = launch.wait()
            output = launch.output()
            self.launch = None
            self.failed_at = time.monotonic()
            if status == 0:
                say("training completed" + (f" after {restarts} restart(s)" if restarts else ""))
                return 0
            stopped = PREEMPTED_RE.search(output)
            if self.stop_signal is not None or status == EXIT_PREEMPTED or stopped:
                if stopped or status == EXIT_PREEMPTED:
                    # The ranks stopped at one step and the chief checkpointed it (mpirun
                    # reports 1 rather than the ranks' 75 when it was signalled itself).
                    where = f" after step {stopped.group(1)}" if stopped else ""
                    say(f"the job was preempted: it stopped{where} and checkpointed (job exit "
                        f"{status}); the same command resumes it (exit {EXIT_PREEMPTED})")
                    return EXIT_PREEMPTED
                say(f"the job ended on a signal (exit {status}) without saying it "
                    f"checkpointed; the same command resumes from the newest valid checkpoint "
                    f"in {self.shape.checkpoint_dir}")
                return status
            if self.interrupted:
                say(f"interrupted (exit {status}); not restarting")
                return status
            cause = failure_cause(status, output)
            if status in FINAL_CODES:
                say(f"the job failed: {cause}; not restarting: {FINAL_CODES[status]}")
                return status
            say(f"the job failed: {cause}")
            last_cause, last_status = cause, status
            if restarts == self.max_restarts:
                say(f"giving up after {restarts} restart(s) (--max-restarts "
                    f"{self.max_restarts}); the last failure: {cause}")
                return status
            restarts += 1
            # A job that fails before it trains (mpirun or a daemon cannot start) would use
            # up the restarts in a burst: wait 1, 2, 4 ... 30 s before such relaunches.
            quick_failures = 0 if launch.progressed else quick_failures + 1
            if quick_failures > 0:
                pause = min(2.0 ** (quick_failures - 1), 30.0)
                say(f"the job failed before it trained (no step, checkpoint or resume seen): "
                    f"waiting {pause:g} s before the relaunch")
                time.sleep(pause)
            # From here on every launch resumes, whatever --resume the first one had.
            args = strip_flag(self.args, "--resume") + ["--resume", "auto"]
