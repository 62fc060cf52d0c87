//! The ledger oracle (docs/design.md "Oracles"): each phase writes one unique id into each of 12
//! distinct cells and keeps every earlier id; a check reads every acknowledged id back, retrying
//! briefly through handoffs. Any missing or wrong value fails; a definite wrong answer is final and
//! is never retried into a pass. Only acknowledged ids count: an id whose write never got a clear
//! acknowledgement is reported, not checked.
//!
//! Members are addressed by base URLs `http://<ip>:8080` chosen by the caller (fresh Pod IPs in
//! the cluster tests); writes and reads rotate over them, so requests reach non-owners too and
//! exercise forwarding.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use serde_json::Value;

use crate::http::{self, Limits};

/// Cells written per phase.
pub const CELLS_PER_PHASE: usize = 12;

/// One acknowledged write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub phase: u32,
    pub cell: String,
    pub id: String,
}

impl fmt::Display for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "phase {} cell {} id {}", self.phase, self.cell, self.id)
    }
}

/// The result of one write phase.
#[derive(Debug, Default)]
pub struct PhaseReport {
    pub phase: u32,
    pub acknowledged: Vec<Ack>,
    /// Writes with no clear acknowledgement before the deadline: (cell, id, last error).
    pub unacknowledged: Vec<(String, String, String)>,
}

impl PhaseReport {
    pub fn complete(&self) -> bool {
        self.unacknowledged.is_empty()
    }
}

/// The result of reading every acknowledged id back.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub checked: usize,
    /// A member answered `{"stored": false}` for an acknowledged id.
    pub missing: Vec<Ack>,
    /// A member answered 200 with anything else: (ack, answer).
    pub wrong: Vec<(Ack, String)>,
    /// No definite answer before the read deadline: (ack, last error).
    pub unanswered: Vec<(Ack, String)>,
    /// A never-written id was reported stored: (cell, id, answer). A member that says yes to
    /// everything would otherwise pass.
    pub false_positives: Vec<(String, String, String)>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.missing.is_empty()
            && self.wrong.is_empty()
            && self.unanswered.is_empty()
            && self.false_positives.is_empty()
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "checked {} acknowledged ids: {} missing, {} wrong, {} unanswered, {} false positives",
            self.checked,
            self.missing.len(),
            self.wrong.len(),
            self.unanswered.len(),
            self.false_positives.len()
        );
        for a in &self.missing {
            s.push_str(&format!("\n  missing: {a}"));
        }
        for (a, ans) in &self.wrong {
            s.push_str(&format!("\n  wrong: {a}: {ans}"));
        }
        for (a, why) in &self.unanswered {
            s.push_str(&format!("\n  unanswered: {a}: {why}"));
        }
        for (c, i, ans) in &self.false_positives {
            s.push_str(&format!("\n  false positive: cell {c} id {i}: {ans}"));
        }
        s
    }
}

/// The writer/checker. Keeps every acknowledged id of every phase.
pub struct Ledger {
    run: String,
    cells: Vec<String>,
    acked: Vec<Ack>,
    phase: u32,
    /// How long one id may be retried before the write counts as unacknowledged.
    pub write_deadline: Duration,
    /// How long one read may be retried through 503s and transport errors.
    pub read_deadline: Duration,
    /// Pause between retries.
    pub retry_pause: Duration,
}

enum Answer {
    Json(Value),
    Retry(String),
}

fn sanitize(run: &str) -> String {
    let s: String = run
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(60)
        .collect();
    if s.is_empty() {
        "ledger".into()
    } else {
        s
    }
}

fn short_random() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

async fn request(member: &str, method: Method, cell: &str, id: &str) -> Answer {
    let Some((host, port, _)) = http::split_http_url(member) else {
        return Answer::Retry(format!("bad member URL {member:?}"));
    };
    let Ok(ip) = host.parse::<IpAddr>() else {
        return Answer::Retry(format!("member URL {member:?} must use an IP address"));
    };
    let path = format!("/?cell={cell}&id={id}");
    let limits = Limits {
        connect: Duration::from_secs(1),
        total: Duration::from_secs(10),
        max_body: 1 << 20,
    };
    match http::call(
        SocketAddr::new(ip, port),
        &format!("{host}:{port}"),
        method,
        &path,
        &[],
        Bytes::new(),
        limits,
    )
    .await
    {
        Ok(resp) if resp.status == 200 => match serde_json::from_slice::<Value>(&resp.body) {
            Ok(v) => Answer::Json(v),
            // A 200 that is not JSON is a definite wrong answer, not a transient one.
            Err(_) => Answer::Json(Value::String(
                String::from_utf8_lossy(&resp.body).into_owned(),
            )),
        },
        Ok(resp) => Answer::Retry(format!(
            "{member} answered {}: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
                .chars()
                .take(200)
                .collect::<String>()
        )),
        Err(e) => Answer::Retry(e.to_string()),
    }
}

impl Ledger {
    /// A ledger whose cells and ids are prefixed by `run` (keep it unique per test).
    pub fn new(run: &str) -> Ledger {
        let run = sanitize(run);
        let cells = (0..CELLS_PER_PHASE)
            .map(|i| format!("{run}-cell-{i:02}"))
            .collect();
        Ledger {
            run,
            cells,
            acked: Vec::new(),
            phase: 0,
            write_deadline: Duration::from_secs(30),
            read_deadline: Duration::from_secs(20),
            retry_pause: Duration::from_millis(200),
        }
    }

    pub fn cells(&self) -> &[String] {
        &self.cells
    }

    pub fn acknowledged(&self) -> &[Ack] {
        &self.acked
    }

    /// Writes one new unique id into each of the 12 cells, rotating over `members`.
    pub async fn write_phase(&mut self, members: &[String]) -> PhaseReport {
        assert!(!members.is_empty(), "the ledger needs at least one member");
        self.phase += 1;
        let mut report = PhaseReport {
            phase: self.phase,
            ..Default::default()
        };
        for (i, cell) in self.cells.clone().iter().enumerate() {
            let id = format!("{}-p{}-c{i:02}-{}", self.run, self.phase, short_random());
            let deadline = Instant::now() + self.write_deadline;
            let mut attempt = 0usize;
            let mut last;
            loop {
                let member = &members[(i + attempt) % members.len()];
                attempt += 1;
                match request(member, Method::PUT, cell, &id).await {
                    Answer::Json(v) if v["stored"] == true && v["id"] == id.as_str() => {
                        let ack = Ack {
                            phase: self.phase,
                            cell: cell.clone(),
                            id: id.clone(),
                        };
                        self.acked.push(ack.clone());
                        report.acknowledged.push(ack);
                        break;
                    }
                    // Anything but a clear acknowledgement is not one: retry the same id
                    // (writes are idempotent), never count it.
                    Answer::Json(v) => last = format!("{member} answered 200 {v}"),
                    Answer::Retry(why) => last = why,
                }
                if Instant::now() >= deadline {
                    report.unacknowledged.push((cell.clone(), id.clone(), last));
                    break;
                }
                tokio::time::sleep(self.retry_pause).await;
            }
        }
        report
    }

    /// One phase of the ledger oracle (docs/design.md "Oracles"): write 12 new ids, then read every
    /// acknowledged id of every phase back. `Err` carries a readable account of what failed.
    pub async fn phase(
        &mut self,
        members: &[String],
    ) -> Result<(PhaseReport, CheckReport), String> {
        let written = self.write_phase(members).await;
        let checked = self.check(members).await;
        if !written.complete() {
            return Err(format!(
                "phase {}: {} writes unacknowledged: {:?}",
                written.phase,
                written.unacknowledged.len(),
                written.unacknowledged
            ));
        }
        if !checked.passed() {
            return Err(format!("phase {}: {}", written.phase, checked.summary()));
        }
        Ok((written, checked))
    }

    /// Reads every acknowledged id back, plus one never-written id per cell.
    pub async fn check(&self, members: &[String]) -> CheckReport {
        assert!(!members.is_empty(), "the ledger needs at least one member");
        let mut report = CheckReport::default();
        for (n, ack) in self.acked.iter().enumerate() {
            report.checked += 1;
            match self.read(members, n, &ack.cell, &ack.id).await {
                Ok(v) if v["stored"] == true => {}
                Ok(v) if v["stored"] == false => report.missing.push(ack.clone()),
                Ok(v) => report.wrong.push((ack.clone(), v.to_string())),
                Err(why) => report.unanswered.push((ack.clone(), why)),
            }
        }
        for (n, cell) in self.cells.iter().enumerate() {
            let id = format!("{}-never-{}", self.run, short_random());
            match self.read(members, n, cell, &id).await {
                Ok(v) if v["stored"] == false => {}
                Ok(v) => report
                    .false_positives
                    .push((cell.clone(), id.clone(), v.to_string())),
                Err(why) => report.unanswered.push((
                    Ack {
                        phase: 0,
                        cell: cell.clone(),
                        id,
                    },
                    why,
                )),
            }
        }
        report
    }

    /// A definite 200 answer, or the last transient error at the deadline. A definite answer
    /// ends the read: it is never retried.
    async fn read(
        &self,
        members: &[String],
        start: usize,
        cell: &str,
        id: &str,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + self.read_deadline;
        let mut attempt = 0usize;
        loop {
            let member = &members[(start + attempt) % members.len()];
            attempt += 1;
            match request(member, Method::GET, cell, id).await {
                Answer::Json(v) => return Ok(v),
                Answer::Retry(why) => {
                    if Instant::now() >= deadline {
                        return Err(why);
                    }
                }
            }
            tokio::time::sleep(self.retry_pause).await;
        }
    }
}
