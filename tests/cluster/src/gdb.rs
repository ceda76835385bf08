//! Stopping a server backend at a chosen function with gdb, to force an interleaving
//! instead of hoping for it: gdb runs in MI mode (asynchronous, so it takes commands while
//! the backend runs), attached to the backend's pid, with a breakpoint on the function.
//! Dropping a `Gdb` always lets the backend go: it interrupts it if it runs, removes the
//! breakpoints, detaches and ends gdb, and as a last resort kills gdb and sends SIGCONT.
//!
//! Needs gdb (`apt-get install -y gdb`) and the right to ptrace server processes (root).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::proc_stat;

/// A gdb attached to one process, talking GDB/MI over pipes.
pub struct Gdb {
    pub pid: i32,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    token: u64,
    running: bool,
    released: bool,
    /// Every line gdb wrote, for a failing test's message.
    pub transcript: Vec<String>,
}

impl Gdb {
    /// Attaches to `pid`, sets a breakpoint on `function` and lets the process run on.
    /// Signals PostgreSQL sends its backends (SIGUSR1 and friends) pass without a stop.
    pub fn attach_and_break(pid: i32, function: &str) -> Gdb {
        let mut child = Command::new("gdb")
            .args(["--interpreter=mi3", "-q", "-nx"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gdb (apt-get install -y gdb)");
        let stdin = child.stdin.take().expect("gdb stdin");
        let stdout = child.stdout.take().expect("gdb stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut gdb = Gdb {
            pid,
            child,
            stdin,
            lines,
            token: 0,
            running: false,
            released: false,
            transcript: Vec::new(),
        };
        let t = Duration::from_secs(20);
        gdb.command("-gdb-set mi-async on", t);
        gdb.command("-gdb-set pagination off", t);
        gdb.command("-gdb-set confirm off", t);
        gdb.command("-gdb-set debuginfod enabled off", t);
        gdb.command(
            "-interpreter-exec console \"handle SIGUSR1 SIGUSR2 SIGALRM SIGPIPE SIGHUP SIGURG SIGCHLD nostop noprint pass\"",
            t,
        );
        gdb.command(&format!("-target-attach {pid}"), t);
        let bkpt = gdb.command(&format!("-break-insert {function}"), t);
        assert!(
            bkpt.contains("bkpt="),
            "gdb: no breakpoint on {function}: {bkpt}"
        );
        gdb.resume();
        gdb
    }

    /// Sends an MI command and waits for its result record (`^done`, `^running`...);
    /// panics on `^error` or when none comes within `within`.
    pub fn command(&mut self, cmd: &str, within: Duration) -> String {
        self.token += 1;
        let token = self.token;
        writeln!(self.stdin, "{token}{cmd}").expect("write to gdb");
        self.stdin.flush().expect("flush gdb stdin");
        let prefix = format!("{token}^");
        let line = self
            .wait_line(within, |l| l.starts_with(&prefix))
            .unwrap_or_else(|| {
                panic!(
                    "gdb: no answer to {cmd} within {within:?}\n{}",
                    self.transcript.join("\n")
                )
            });
        assert!(
            !line.starts_with(&format!("{token}^error")),
            "gdb: {cmd}: {line}"
        );
        line
    }

    /// The next line matching `want`, within `within`; every line read is kept.
    fn wait_line(&mut self, within: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.transcript.push(line.clone());
                    if line.starts_with("*running") {
                        self.running = true;
                    }
                    if line.starts_with("*stopped") {
                        self.running = false;
                    }
                    if want(&line) {
                        return Some(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return None
                }
            }
        }
    }

    fn resume(&mut self) {
        self.command("-exec-continue", Duration::from_secs(10));
        self.running = true;
    }

    /// Waits until the process stops at a breakpoint; other stops (a signal gdb was not
    /// told to let pass) are continued. Returns the `*stopped` record.
    pub fn wait_for_breakpoint(&mut self, within: Duration) -> String {
        self.stopped_within(within).unwrap_or_else(|| {
            panic!(
                "gdb: pid {} did not stop at the breakpoint within {within:?}\n{}",
                self.pid,
                self.transcript.join("\n")
            )
        })
    }

    /// As `wait_for_breakpoint`, but None when the process did not stop there within
    /// `within` (for a test that also watches for the call to end without stopping).
    pub fn stopped_within(&mut self, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let stop = self.wait_line(left, |l| l.starts_with("*stopped"))?;
            if stop.contains("reason=\"breakpoint-hit\"") {
                return Some(stop);
            }
            if stop.contains("reason=\"exited") {
                return None; // the process is gone: it never will
            }
            self.resume();
        }
    }

    /// Runs the stopped process to the end of the function it is stopped in (gdb's
    /// `finish`), and waits until it stops there: the instructions right after the call.
    pub fn finish(&mut self, within: Duration) {
        self.command("-exec-finish", within);
        self.running = true;
        // Its stop has reason "function-finished" only where gdb knows the caller's frame
        // (debug symbols); any stop after the `finish` is that one.
        self.wait_line(within, |l| l.starts_with("*stopped"))
            .unwrap_or_else(|| {
                panic!(
                    "gdb: pid {} did not finish its function within {within:?}\n{}",
                    self.pid,
                    self.transcript.join("\n")
                )
            });
    }

    /// The stopped process's stack, innermost first (function names, `??` unknown).
    pub fn backtrace(&mut self) -> Vec<String> {
        let frames = self.command("-stack-list-frames 0 40", Duration::from_secs(10));
        frames
            .split("frame={")
            .skip(1)
            .map(|f| {
                f.split("func=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap_or("??")
                    .to_string()
            })
            .collect()
    }

    /// Removes the breakpoints, detaches (the process runs on) and ends gdb.
    pub fn release(&mut self) {
        if self.released {
            return;
        }
        let t = Duration::from_secs(10);
        if self.running {
            self.command("-exec-interrupt", t);
            let _ = self.wait_line(t, |l| l.starts_with("*stopped"));
        }
        self.command("-break-delete", t);
        self.command("-target-detach", t);
        self.released = true;
        let _ = writeln!(self.stdin, "-gdb-exit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + t;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Gdb {
    fn drop(&mut self) {
        if !self.released {
            // Not with `release`, whose panics would abort a test that is already failing.
            let t = Duration::from_secs(5);
            let mut token = self.token;
            let mut send = |gdb: &mut Gdb, cmd: &str| {
                token += 1;
                let _ = writeln!(gdb.stdin, "{token}{cmd}");
                let _ = gdb.stdin.flush();
                let prefix = format!("{token}^");
                gdb.wait_line(t, |l| l.starts_with(&prefix))
            };
            if self.running {
                send(self, "-exec-interrupt");
                let _ = self.wait_line(t, |l| l.starts_with("*stopped"));
            }
            send(self, "-break-delete");
            send(self, "-target-detach");
            let _ = writeln!(self.stdin, "-gdb-exit");
            let _ = self.stdin.flush();
            let deadline = Instant::now() + t;
            while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
                thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A tracer that died leaves its tracee stopped at worst: let it run.
        if matches!(proc_stat(self.pid), Some(('T', _)) | Some(('t', _))) {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}
