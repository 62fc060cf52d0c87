//! Fuzzes the strict annotation decoder: it must never panic, and whatever it accepts must
//! re-encode to a document that decodes to the same value. Accepted entries are also folded
//! (transition rules) and verified (hash chain), which must not panic either.
#![no_main]

use journal::{chain, decode_document, decode_entry, Fold, HARD_MAX_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(doc) = decode_document(text) {
        let encoded = doc.encode();
        assert_eq!(encoded.len(), doc.encoded_len());
        // Normalisation (e.g. "+01:00" to "Z", ".5" to ".500") can lengthen a document that
        // was at the hard maximum; the journal never writes such a document (its budget is
        // checked on the encoded form).
        if encoded.len() <= HARD_MAX_BYTES {
            let again = decode_document(&encoded).expect("our own encoding decodes");
            assert_eq!(again, doc);
        }
        let _ = chain::verify(&doc);
        let _ = Fold::from_entries(doc.entries());
        for e in doc.entries() {
            let back = decode_entry(e.to_json()).expect("an accepted entry re-decodes");
            assert_eq!(&back, e);
        }
    }
    let _ = decode_entry(text);
});
