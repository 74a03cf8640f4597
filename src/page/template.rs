//! `page.template_file`: the shop's own page, read and checked when the configuration loads.

/// The largest `page.template_file` read: a page is markup and styles, not a media library, and
/// it is held in memory and sent whole on every load.
pub const MAX_TEMPLATE: u64 = 256 * 1024;

/// `page.template_file`: the shop's own page, read and checked at load (and reload), split at
/// its last `</body>`, where the proxy's script goes.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    pub(super) before_body_end: String,
    pub(super) from_body_end: String,
}

/// A digest rather than the page: a configuration's `Debug` (which a reload compares) need not
/// carry 256 KiB of HTML, yet must still change when the page does.
impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(self.before_body_end.as_bytes());
        hash.update(self.from_body_end.as_bytes());
        let digest = hash.finalize();
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        write!(f, "Template({} bytes, sha256 {hex}..)", self.before_body_end.len() + self.from_body_end.len())
    }
}

impl Template {
    /// Reads and checks a template; the error says what is wrong with the file.
    pub fn load(path: &std::path::Path) -> Result<Template, String> {
        let size = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?.len();
        if size > MAX_TEMPLATE {
            return Err(format!("is {size} bytes, more than the 256 KiB a page may have"));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_owned())?;
        Template::parse(text)
    }

    pub(super) fn parse(text: String) -> Result<Template, String> {
        // The hook the script cannot work without; the others are optional for a shop's design.
        let has_state_hook =
            text.contains(r#"data-waitroom="state""#) || text.contains("data-waitroom='state'") || text.contains("data-waitroom=state ");
        if !has_state_hook {
            return Err(r#"has no element with data-waitroom="state", which the page's script fills in"#.to_owned());
        }
        let lower = text.to_ascii_lowercase();
        let Some(at) = lower.rfind("</body>") else {
            return Err("has no </body>, before which the proxy inserts its script".to_owned());
        };
        Ok(Template { before_body_end: text[..at].to_owned(), from_body_end: text[at..].to_owned() })
    }
}

