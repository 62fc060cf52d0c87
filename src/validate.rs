//! Controller-side validation (docs/design.md "Validation").
//!
//! Admission may have been bypassed (objects stored before this CRD, or with another
//! schema), so the controller re-checks every rule of the CRD schema in memory on the
//! defaulted spec, plus what CEL cannot express well: unique zones, parseable and
//! positive quantities, limits ≥ requests. A failure is reported as
//! `InvalidConfiguration` naming the field path and the problem; the operator then
//! changes nothing.

use std::collections::HashSet;
use std::sync::OnceLock;

use regex::Regex;

use crate::api::patterns;
use crate::api::{BucketWorkload, CelldFleetSpec, Profile};

/// One broken rule: where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Field path, e.g. `spec.placement.azCount`.
    pub path: String,
    /// What is wrong, in words a person can act on.
    pub problem: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// Reserved variable names: the `CELLD_*` variables the operator renders (docs/runtime.md
/// "The member environment").
const RESERVED_ENV: [&str; 12] = [
    "CELLD_NODE",
    "CELLD_ADVERTISE",
    "CELLD_BUCKET",
    "CELLD_DURABILITY",
    "CELLD_ADDR",
    "CELLD_INTERNAL_ADDR",
    "CELLD_WATCH",
    "CELLD_TTL_MS",
    "CELLD_SHUTDOWN_TOTAL_MS",
    "CELLD_TOKIO_THREADS",
    "CELLD_MAX_RESIDENT_CELLS",
    "CELLD_IDLE_EVICT_S",
];
/// Reserved variable prefixes.
const RESERVED_ENV_PREFIXES: [&str; 5] = [
    "CELLD_REEXEC_",
    "CELLD_OTEL",
    "CELLD_UNSAFE_",
    "CELLD_TEST_",
    "CELLD_STRICT_",
];

fn regex(pattern: &'static str) -> Regex {
    Regex::new(pattern).expect("the API patterns are valid regular expressions")
}

struct Patterns {
    dns_subdomain: Regex,
    dns_label: Regex,
    bucket: Regex,
    image: Regex,
    cpu: Regex,
    memory: Regex,
    region: Regex,
    env_name: Regex,
    secret_key: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| Patterns {
        dns_subdomain: regex(patterns::DNS_SUBDOMAIN),
        dns_label: regex(patterns::DNS_LABEL),
        bucket: regex(patterns::BUCKET),
        image: regex(patterns::RUNTIME_IMAGE),
        cpu: regex(patterns::CPU),
        memory: regex(patterns::MEMORY),
        region: regex(patterns::REGION),
        env_name: regex(patterns::ENV_NAME),
        secret_key: regex(patterns::SECRET_KEY),
    })
}

/// Parses a quantity of the shapes the API admits (`250m`, `1.5`, `512Mi`, `2G`) into
/// a value in milli-units, so `1Gi` and `1024Mi` compare equal. `None` when unparseable
/// or out of range.
pub fn parse_quantity_milli(s: &str) -> Option<u128> {
    let (number, multiplier_milli): (&str, u128) = if let Some(n) = s.strip_suffix('m') {
        (n, 1)
    } else {
        const SUFFIXES: [(&str, u128); 8] = [
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("K", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
        ];
        SUFFIXES
            .iter()
            .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, m * 1000)))
            .unwrap_or((s, 1000))
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if number.contains('.') && frac.is_empty() {
        return None;
    }
    let int: u128 = int.parse().ok()?;
    let mut value = int.checked_mul(multiplier_milli)?;
    // Fractions finer than the unit's milli-resolution are rounded down; they never
    // occur in practice and cannot turn an invalid pair into a valid one by more than 1.
    let mut scale = multiplier_milli;
    for digit in frac.bytes().take(30) {
        scale /= 10;
        value = value.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(value)
}

/// Checks the defaulted spec and the fleet name against every rule (docs/design.md
/// "Validation"). Empty means valid.
pub fn validate(name: &str, spec: &CelldFleetSpec) -> Vec<Violation> {
    let p = patterns();
    let mut out = Vec::new();
    let mut fail = |path: &str, problem: String| {
        out.push(Violation {
            path: path.to_string(),
            problem,
        })
    };

    if name.len() > 40 || !p.dns_label.is_match(name) {
        fail(
            "metadata.name",
            "fleet name must be a DNS label of at most 40 characters".into(),
        );
    }
    if let Some(image) = &spec.runtime_image {
        if !p.image.is_match(image) {
            fail("spec.runtimeImage", format!("{image:?} is not a registry-qualified repository pinned by digest (…@sha256:<64 hex>)"));
        }
    }
    if !(1..=100).contains(&spec.replicas) {
        fail(
            "spec.replicas",
            format!("{} is outside 1..100", spec.replicas),
        );
    }
    let sa = &spec.service_account_name;
    if sa.is_empty() || sa.len() > 253 || !p.dns_subdomain.is_match(sa) {
        fail(
            "spec.serviceAccountName",
            format!("{sa:?} is not a DNS subdomain of 1..253 characters"),
        );
    }
    if spec.profile != Profile::Bucket && spec.bucket_workload == BucketWorkload::Ordered {
        fail(
            "spec.bucketWorkload",
            "bucketWorkload Ordered requires profile Bucket".into(),
        );
    }
    if let Some(token) = spec
        .maintenance
        .as_ref()
        .and_then(|m| m.restart_token.as_ref())
    {
        if token.len() > 128 {
            fail(
                "spec.maintenance.restartToken",
                "must be at most 128 characters".into(),
            );
        }
    }

    // storage
    let st = &spec.storage;
    if !(3..=63).contains(&st.bucket.len()) || !p.bucket.is_match(&st.bucket) {
        fail(
            "spec.storage.bucket",
            format!(
                "{:?} is not a bucket name of 3..63 lowercase letters, digits and dashes",
                st.bucket
            ),
        );
    }
    if st.region.len() > 32 || !p.region.is_match(&st.region) {
        fail(
            "spec.storage.region",
            format!("{:?} is not a region name such as us-east-1", st.region),
        );
    }
    let has_class = st
        .storage_class_name
        .as_deref()
        .is_some_and(|c| !c.is_empty());
    if (spec.profile == Profile::PersistentFleet) != has_class {
        fail(
            "spec.storage.storageClassName",
            "storageClassName is required for PersistentFleet and forbidden for Bucket".into(),
        );
    }
    if let Some(class) = st.storage_class_name.as_deref().filter(|c| !c.is_empty()) {
        if class.len() > 253 || !p.dns_subdomain.is_match(class) {
            fail(
                "spec.storage.storageClassName",
                format!("{class:?} is not a DNS subdomain"),
            );
        }
    }
    if !(1..=16384).contains(&st.size_gib) {
        fail(
            "spec.storage.sizeGiB",
            format!("{} is outside 1..16384", st.size_gib),
        );
    }
    if let Some(scratch) = &st.scratch {
        if spec.profile != Profile::Bucket {
            fail(
                "spec.storage.scratch",
                "storage.scratch is only for Bucket".into(),
            );
        }
        let request = quantity(
            &mut fail,
            "spec.storage.scratch.request",
            &scratch.request,
            &p.memory,
        );
        let limit = scratch
            .limit
            .as_ref()
            .and_then(|l| quantity(&mut fail, "spec.storage.scratch.limit", l, &p.memory));
        if let (Some(r), Some(l)) = (request, limit) {
            if l < r {
                fail(
                    "spec.storage.scratch.limit",
                    "scratch limit must be at least the request".into(),
                );
            }
        }
    }
    if st.on_scale_in.is_some() && spec.profile != Profile::PersistentFleet {
        fail(
            "spec.storage.onScaleIn",
            "storage.onScaleIn is only for PersistentFleet".into(),
        );
    }

    // placement
    let pl = &spec.placement;
    if !(1..=6).contains(&pl.az_count) {
        fail(
            "spec.placement.azCount",
            format!("{} is outside 1..6", pl.az_count),
        );
    }
    if !(1..=6).contains(&pl.zones.len()) {
        fail(
            "spec.placement.zones",
            format!("has {} zones; 1..6 are allowed", pl.zones.len()),
        );
    }
    if usize::try_from(pl.az_count).ok() != Some(pl.zones.len()) {
        fail(
            "spec.placement.azCount",
            "azCount must equal the zones count".into(),
        );
    }
    let mut seen = HashSet::new();
    for (i, zone) in pl.zones.iter().enumerate() {
        if !seen.insert(zone) {
            fail(
                &format!("spec.placement.zones[{i}]"),
                format!("zone {zone:?} is listed twice"),
            );
        }
        let standard = zone.len() == st.region.len() + 1
            && zone.starts_with(&st.region)
            && zone.as_bytes().last().is_some_and(u8::is_ascii_lowercase);
        if !standard {
            fail(
                &format!("spec.placement.zones[{i}]"),
                format!("zones must be standard AZ names in storage.region ({zone:?} is not)"),
            );
        }
    }
    if spec.replicas < pl.az_count {
        fail(
            "spec.replicas",
            "replicas must be at least placement.azCount".into(),
        );
    }

    // capacity
    if let Some(c) = &spec.capacity {
        if c.min_replicas > c.max_replicas {
            fail(
                "spec.capacity",
                "capacity.minReplicas must be at most capacity.maxReplicas".into(),
            );
        }
        if c.min_replicas < pl.az_count {
            fail(
                "spec.capacity.minReplicas",
                "capacity.minReplicas must be at least placement.azCount".into(),
            );
        }
        if c.cpu_low_millicores >= c.cpu_high_millicores {
            fail(
                "spec.capacity",
                "capacity.cpuLowMillicores must be below capacity.cpuHighMillicores".into(),
            );
        }
        if c.memory_low_mib >= c.memory_high_mib {
            fail(
                "spec.capacity",
                "capacity.memoryLowMiB must be below capacity.memoryHighMiB".into(),
            );
        }
        if c.min_window_seconds > c.max_window_seconds {
            fail(
                "spec.capacity",
                "capacity.minWindowSeconds must be at most capacity.maxWindowSeconds".into(),
            );
        }
        if c.sample_interval_seconds > c.max_age_seconds {
            fail(
                "spec.capacity",
                "capacity.sampleIntervalSeconds must be at most capacity.maxAgeSeconds".into(),
            );
        }
    }

    // execution
    let ex = &spec.execution;
    let cpu_req = quantity(
        &mut fail,
        "spec.execution.cpuRequest",
        &ex.cpu_request,
        &p.cpu,
    );
    let cpu_lim = ex
        .cpu_limit
        .as_ref()
        .and_then(|l| quantity(&mut fail, "spec.execution.cpuLimit", l, &p.cpu));
    let mem_req = quantity(
        &mut fail,
        "spec.execution.memoryRequest",
        &ex.memory_request,
        &p.memory,
    );
    let mem_lim = quantity(
        &mut fail,
        "spec.execution.memoryLimit",
        &ex.memory_limit,
        &p.memory,
    );
    if let (Some(r), Some(l)) = (cpu_req, cpu_lim) {
        if l < r {
            fail(
                "spec.execution.cpuLimit",
                "cpuLimit must be at least cpuRequest".into(),
            );
        }
    }
    if let (Some(r), Some(l)) = (mem_req, mem_lim) {
        if l < r {
            fail(
                "spec.execution.memoryLimit",
                "memoryLimit must be at least memoryRequest".into(),
            );
        }
    }
    if ex
        .max_resident_cells
        .is_some_and(|v| !(1..=1_000_000).contains(&v))
    {
        fail(
            "spec.execution.maxResidentCells",
            "must be within 1..1000000".into(),
        );
    }
    if ex
        .idle_evict_seconds
        .is_some_and(|v| !(1..=86400).contains(&v))
    {
        fail(
            "spec.execution.idleEvictSeconds",
            "must be within 1..86400".into(),
        );
    }

    // lifecycle
    let lc = &spec.lifecycle;
    if !(1..=3600).contains(&lc.shutdown_seconds) {
        fail(
            "spec.lifecycle.shutdownSeconds",
            format!("{} is outside 1..3600", lc.shutdown_seconds),
        );
    }
    if !(6..=3605).contains(&lc.termination_grace_seconds) {
        fail(
            "spec.lifecycle.terminationGraceSeconds",
            format!("{} is outside 6..3605", lc.termination_grace_seconds),
        );
    }
    if i64::from(lc.termination_grace_seconds) < i64::from(lc.shutdown_seconds) + 5 {
        fail(
            "spec.lifecycle",
            "terminationGraceSeconds must be at least shutdownSeconds + 5".into(),
        );
    }

    // env
    if let Some(env) = &spec.env {
        if env.len() > 32 {
            fail(
                "spec.env",
                format!("has {} entries; at most 32 are allowed", env.len()),
            );
        }
        let mut names = HashSet::new();
        for (i, var) in env.iter().enumerate() {
            let path = format!("spec.env[{i}]");
            if !names.insert(&var.name) {
                fail(&path, format!("variable {} is listed twice", var.name));
            }
            if var.name.len() > 128 || !p.env_name.is_match(&var.name) {
                fail(
                    &format!("{path}.name"),
                    format!("{:?} must match ^CELLD_[A-Z][A-Z0-9_]*$", var.name),
                );
            }
            if RESERVED_ENV.contains(&var.name.as_str())
                || RESERVED_ENV_PREFIXES
                    .iter()
                    .any(|pre| var.name.starts_with(pre))
            {
                fail(
                    &format!("{path}.name"),
                    "this variable is set by the operator or reserved".into(),
                );
            }
            if var.value.is_some() == var.secret_key_ref.is_some() {
                fail(&path, "exactly one of value or secretKeyRef".into());
            }
            if var.value.as_ref().is_some_and(|v| v.len() > 4096) {
                fail(
                    &format!("{path}.value"),
                    "must be at most 4096 characters".into(),
                );
            }
            if let Some(r) = &var.secret_key_ref {
                if r.name.is_empty() || r.name.len() > 253 || !p.dns_subdomain.is_match(&r.name) {
                    fail(
                        &format!("{path}.secretKeyRef.name"),
                        format!("{:?} is not a Secret name", r.name),
                    );
                }
                if r.key.is_empty() || r.key.len() > 253 || !p.secret_key.is_match(&r.key) {
                    fail(
                        &format!("{path}.secretKeyRef.key"),
                        format!("{:?} is not a Secret key", r.key),
                    );
                }
            }
        }
    }
    out
}

fn quantity(
    fail: &mut impl FnMut(&str, String),
    path: &str,
    value: &str,
    pattern: &Regex,
) -> Option<u128> {
    if value.len() > 32 || !pattern.is_match(value) {
        fail(path, format!("{value:?} is not a valid quantity"));
        return None;
    }
    match parse_quantity_milli(value) {
        Some(0) => {
            fail(path, format!("{value:?} must be positive"));
            None
        }
        Some(v) => Some(v),
        None => {
            fail(path, format!("{value:?} is not a valid quantity"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixtures::spec;

    fn paths(name: &str, s: &CelldFleetSpec) -> Vec<String> {
        validate(name, s).into_iter().map(|v| v.path).collect()
    }

    #[test]
    fn the_samples_shape_is_valid() {
        assert!(validate("beta", &spec("PersistentFleet")).is_empty());
        assert!(validate("alpha", &spec("Bucket")).is_empty());
    }

    #[test]
    fn quantities_compare_by_value() {
        assert_eq!(parse_quantity_milli("1Gi"), parse_quantity_milli("1024Mi"));
        assert_eq!(parse_quantity_milli("250m"), Some(250));
        assert_eq!(parse_quantity_milli("0.5"), Some(500));
        assert_eq!(parse_quantity_milli("1.5Ki"), Some(1536 * 1000));
        assert_eq!(parse_quantity_milli("1."), None);
        assert_eq!(parse_quantity_milli("x"), None);
    }

    #[test]
    fn duplicate_zones_and_zero_quantities_are_reported_with_their_paths() {
        let mut s = spec("Bucket");
        s.placement.zones = vec![
            "us-east-1a".into(),
            "us-east-1a".into(),
            "us-east-1b".into(),
        ];
        s.execution.cpu_request = "0".into();
        let p = paths("alpha", &s);
        assert!(p.contains(&"spec.placement.zones[1]".to_string()), "{p:?}");
        assert!(
            p.contains(&"spec.execution.cpuRequest".to_string()),
            "{p:?}"
        );
    }

    #[test]
    fn limits_below_requests_are_invalid_by_value_not_by_text() {
        let mut s = spec("Bucket");
        s.execution.memory_request = "1024Mi".into();
        s.execution.memory_limit = "1Gi".into();
        assert!(validate("a", &s).is_empty(), "1Gi == 1024Mi");
        s.execution.memory_limit = "1000Mi".into();
        assert_eq!(paths("a", &s), ["spec.execution.memoryLimit"]);
    }

    #[test]
    fn every_cross_field_rule_is_rechecked() {
        let mut s = spec("PersistentFleet");
        s.bucket_workload = BucketWorkload::Ordered;
        s.storage.scratch =
            Some(serde_json::from_value(serde_json::json!({"request": "1Gi"})).unwrap());
        s.replicas = 2;
        s.lifecycle.shutdown_seconds = 26;
        s.env = Some(
            serde_json::from_value(serde_json::json!([{"name": "CELLD_TEST_X", "value": "1"}]))
                .unwrap(),
        );
        let p = paths("Bad.Name", &s);
        for expected in [
            "metadata.name",
            "spec.bucketWorkload",
            "spec.storage.scratch",
            "spec.replicas",
            "spec.lifecycle",
            "spec.env[0].name",
        ] {
            assert!(
                p.contains(&expected.to_string()),
                "{expected} missing from {p:?}"
            );
        }
        let mut b = spec("Bucket");
        b.storage.storage_class_name = Some("fast".into());
        b.storage.on_scale_in = Some(crate::api::OnScaleIn::Retire);
        b.placement.zones[2] = "eu-west-1c".into();
        let p = paths("a", &b);
        for expected in [
            "spec.storage.storageClassName",
            "spec.storage.onScaleIn",
            "spec.placement.zones[2]",
        ] {
            assert!(
                p.contains(&expected.to_string()),
                "{expected} missing from {p:?}"
            );
        }
    }
}
