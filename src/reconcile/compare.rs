//! "Equal" for rendered vs live objects (docs/design.md "Comparing rendered and live objects"):
//! every rendered field has an equal live value; lists compare element-wise with equal length;
//! quantities compare by value (`1Gi` = `1024Mi`); fields the operator does not render are ignored.

use serde_json::Value;

use crate::validate::parse_quantity_milli;

/// Whether every field of `rendered` has an equal value in `live`.
pub fn rendered_matches(rendered: &Value, live: &Value) -> bool {
    match (rendered, live) {
        (Value::Object(r), Value::Object(l)) => r.iter().all(|(k, rv)| match l.get(k) {
            Some(lv) => rendered_matches(rv, lv),
            None => rv.is_null(),
        }),
        (Value::Array(r), Value::Array(l)) => {
            r.len() == l.len() && r.iter().zip(l).all(|(a, b)| rendered_matches(a, b))
        }
        (Value::String(r), Value::String(l)) => {
            r == l
                || matches!((parse_quantity_milli(r), parse_quantity_milli(l)), (Some(a), Some(b)) if a == b)
        }
        (Value::String(r), Value::Number(n)) | (Value::Number(n), Value::String(r)) => {
            r == &n.to_string()
        }
        (Value::Null, _) => true,
        (r, l) => r == l,
    }
}

/// The first differing path, for messages and logs.
pub fn first_difference(rendered: &Value, live: &Value, path: &str) -> Option<String> {
    match (rendered, live) {
        (Value::Object(r), Value::Object(l)) => r.iter().find_map(|(k, rv)| match l.get(k) {
            Some(lv) => first_difference(rv, lv, &format!("{path}.{k}")),
            None if rv.is_null() => None,
            None => Some(format!("{path}.{k}")),
        }),
        (Value::Array(r), Value::Array(l)) if r.len() == l.len() => r
            .iter()
            .zip(l)
            .enumerate()
            .find_map(|(i, (a, b))| first_difference(a, b, &format!("{path}[{i}]"))),
        _ if rendered_matches(rendered, live) => None,
        _ => Some(path.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_added_by_the_api_server_are_ignored() {
        let rendered = json!({"containers": [{"name": "celld", "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]});
        let live = json!({"containers": [{"name": "celld", "terminationMessagePath": "/dev/termination-log",
            "ports": [{"containerPort": 8080, "protocol": "TCP"}]}], "dnsPolicy": "ClusterFirst"});
        assert!(rendered_matches(&rendered, &live));
    }

    #[test]
    fn quantities_compare_by_value_and_lists_by_length() {
        assert!(rendered_matches(
            &json!({"memory": "1Gi"}),
            &json!({"memory": "1024Mi"})
        ));
        assert!(!rendered_matches(
            &json!({"memory": "1Gi"}),
            &json!({"memory": "1000Mi"})
        ));
        assert!(!rendered_matches(
            &json!({"env": [{"name": "A"}]}),
            &json!({"env": [{"name": "A"}, {"name": "B"}]})
        ));
        assert_eq!(
            first_difference(
                &json!({"a": {"image": "x"}}),
                &json!({"a": {"image": "y"}}),
                "template"
            ),
            Some("template.a.image".into())
        );
    }
}
