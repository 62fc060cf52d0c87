//! Labels, annotations, finalizers and gates (docs/design.md "Labels, annotations and finalizers").

/// Label carried by every owned object; the selector of every workload.
pub const FLEET_UID_LABEL: &str = "celld.eric.dev/fleet-uid";
/// Finalizer held on a fleet until teardown finished.
pub const LIFECYCLE_FINALIZER: &str = "celld.eric.dev/lifecycle-protection";
/// The operation journal annotation on the fleet.
pub const JOURNAL_ANNOTATION: &str = "celld.eric.dev/journal";
/// `abandon <op>` | `retry <op>`, written by the CLI, consumed by the operator.
pub const JOURNAL_COMMAND_ANNOTATION: &str = "celld.eric.dev/journal-command";
/// The operator installations (Leases) that reconciled the fleet recently, JSON
/// `{"<ns>/<lease>": {"holder": "<identity>", "seen": "<RFC 3339>"}}` (docs/operations.md
/// "Two operator installations").
pub const OPERATORS_ANNOTATION: &str = "celld.eric.dev/operators";
/// Administrative member replacement request.
pub const REPLACE_MEMBER_ANNOTATION: &str = "celld.eric.dev/replace-member";
/// `<operationId>/<step>` of the last workload write (workload metadata only).
pub const EFFECT_ANNOTATION: &str = "celld.eric.dev/effect";
/// On the workload: `<op>/fenced`, written (with the read resourceVersion) by the replica that
/// closes an operation whose effect it did not see land, so a write decided on an earlier
/// read by a deposed leader fails its precondition.
pub const FENCE_ANNOTATION: &str = "celld.eric.dev/fence";
/// Last applied restart token (Pod template).
pub const RESTART_TOKEN_ANNOTATION: &str = "celld.eric.dev/restart-token";
/// Reservation name (claim template).
pub const STORAGE_RESERVATION_ANNOTATION: &str = "celld.eric.dev/storage-reservation";
/// Spec-hash encoding of a reservation.
pub const SPEC_HASH_FORMAT_ANNOTATION: &str = "celld.eric.dev/spec-hash-format";
/// The only spec-hash format this release writes.
pub const SPEC_HASH_FORMAT: &str = "jcs-sha256-v1";
/// Finalizer of a replacement hold on a member Pod (docs/design.md "Member replacement"): the
/// Pod keeps the member's name while its old disk is released.
pub const REPLACING_FINALIZER: &str = "celld.eric.dev/replacing-disk";
/// Label of a held Pod: the UID of the fleet whose replacement holds it.
pub const REPLACEMENT_FLEET_LABEL: &str = "celld.eric.dev/replacement-fleet";
/// Annotation of a held Pod: `{"fleetUID","claimUID","claimResourceVersion","committed","operationId"}`.
pub const REPLACEMENT_CLAIM_ANNOTATION: &str = "celld.eric.dev/replacement-claim";
