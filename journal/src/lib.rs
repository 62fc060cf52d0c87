//! The celld-operator operation journal (skeleton; see spec/journal.md).
