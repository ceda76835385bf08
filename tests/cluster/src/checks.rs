//! The token checks that client tests share: each check is printed, and a test fails at
//! its end with every check that did not hold, so one run shows them all. Also what they
//! grant with, and how a token is taken apart (docs/tokens.md).

use crate::Client;

/// 2^53 - 1, the highest token a client may see.
pub const MAX_TOKEN: i64 = (1 << 53) - 1;

/// A token of the safe layout is a 12-bit era over a 41-bit counter (docs/tokens.md).
pub const ERA_SHIFT: u32 = 41;

/// 0.2.0's layout: a 20-bit epoch over a 43-bit counter.
pub const WIDE_ERA_SHIFT: u32 = 43;

/// The checks of one test: each is printed, and the test fails at the end with every one
/// that did not hold (so one run shows them all).
pub struct Checks {
    test: &'static str,
    failed: Vec<String>,
}

impl Checks {
    pub fn new(test: &'static str) -> Checks {
        Checks {
            test,
            failed: Vec::new(),
        }
    }

    pub fn check(&mut self, ok: bool, what: String) {
        println!(
            "{}: {} {what}",
            self.test,
            if ok { "ok    " } else { "FAILED" }
        );
        if !ok {
            self.failed.push(what);
        }
    }

    /// Every token is in 1..=2^53-1.
    pub fn in_range(&mut self, label: &str, tokens: &[i64]) {
        let outside: Vec<i64> = tokens
            .iter()
            .copied()
            .filter(|t| !(1..=MAX_TOKEN).contains(t))
            .collect();
        self.check(
            outside.is_empty(),
            format!(
                "{label}: all {} tokens in 1..={MAX_TOKEN} (outside: {} of them{})",
                tokens.len(),
                outside.len(),
                outside
                    .first()
                    .map(|t| format!(", e.g. {t}"))
                    .unwrap_or_default()
            ),
        );
    }

    /// Every token of `after` is above every token of `before`.
    pub fn above(&mut self, label: &str, after: &[i64], before: &[i64]) {
        let highest = before.iter().copied().max().expect("tokens before");
        let lowest = after.iter().copied().min().expect("tokens after");
        let repeated = after.iter().filter(|t| before.contains(t)).count();
        self.check(
            lowest > highest,
            format!(
                "{label}: lowest after {lowest} (era {}) > highest before {highest} (era {}) \
                 ({} after, {} before, {repeated} repeated)",
                era_of(lowest),
                era_of(highest),
                after.len(),
                before.len()
            ),
        );
    }

    /// The tokens, in the order they were granted, rise strictly.
    pub fn increasing(&mut self, label: &str, granted: &[(String, i64)]) {
        let first_fall = granted
            .windows(2)
            .find(|w| w[1].1 <= w[0].1)
            .map(|w| format!("; {} {} then {} {}", w[0].0, w[0].1, w[1].0, w[1].1));
        self.check(
            first_fall.is_none(),
            format!(
                "{label}: all {} tokens rise strictly in the order granted{}",
                granted.len(),
                first_fall.unwrap_or_default()
            ),
        );
    }

    pub fn finish(self) {
        assert!(
            self.failed.is_empty(),
            "{}: {} check(s) failed:\n  {}",
            self.test,
            self.failed.len(),
            self.failed.join("\n  ")
        );
    }
}

/// One autocommit grant of `lock` to `owner` (or a grant inside the client's open
/// transaction); its token.
pub fn grant(c: &mut Client, lock: &str, owner: &str) -> i64 {
    let token: Option<i64> = c
        .query_one(
            "SELECT (lockext.lock_acquire($1, $2, '1 hour')).fence_token",
            &[&lock, &owner],
        )
        .unwrap_or_else(|e| panic!("lock_acquire({lock}): {e}"))
        .get(0);
    token.unwrap_or_else(|| panic!("{lock} was free, yet not granted"))
}

/// `n` grants of fresh locks `prefix-0..n`; their tokens.
pub fn grant_many(c: &mut Client, prefix: &str, n: usize) -> Vec<i64> {
    (0..n)
        .map(|i| grant(c, &format!("{prefix}-{i}"), "client"))
        .collect()
}

/// Runs each `;`-separated statement on its own (ALTER SYSTEM, DROP DATABASE and CREATE
/// DATABASE refuse to run inside one multi-statement batch), failing with the statement
/// and the server's message.
pub fn sql(c: &mut Client, text: &str) {
    for statement in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        c.batch_execute(statement).unwrap_or_else(|e| {
            let why = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string());
            panic!("{statement}: {why}")
        });
    }
}

pub fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).expect(sql).get(0)
}

/// A token's era: of the safe layout up to 2^53 - 1, of 0.2.0's above.
pub fn era_of(token: i64) -> i64 {
    if token > MAX_TOKEN {
        token >> WIDE_ERA_SHIFT
    } else {
        token >> ERA_SHIFT
    }
}

pub fn eras(tokens: &[i64]) -> Vec<i64> {
    let mut eras: Vec<i64> = tokens.iter().map(|&t| era_of(t)).collect();
    eras.sort();
    eras.dedup();
    eras
}
