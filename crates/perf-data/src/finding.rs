//! A finding: the rule a record broke and what it says.

/// One finding: the rule and what broke it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub message: String,
    /// The ledger entry that explains it on this file's kernel, when one
    /// does: a known bug, not news.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_issue: Option<String>,
}

impl Finding {
    pub(crate) fn new(rule: &'static str, message: String) -> Finding {
        Finding {
            rule,
            message,
            known_issue: None,
        }
    }
}
