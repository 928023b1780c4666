//! Bearer tokens: a tokens file maps each token to the projects it may use, read-only or
//! read-write. No or an unknown token: 401 UNAUTHENTICATED; a project the token may not
//! use, or a write with a read-only token: 403 PERMISSION_DENIED. Without a tokens file the
//! server is open, and `serve` allows that only on a loopback address.
//!
//! The file holds secrets: one that other users may read or change (any group or other
//! permission bit) is refused, with the fix (`chmod 600 FILE`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use trainyard_api::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("tokens file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("tokens file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// Other users may read or change the file.
    #[error(
        "tokens file {path} has mode {mode:04o}: other users may read or change it, and it holds secrets; \
         fix it with `chmod 600 {path}`",
        path = path.display()
    )]
    Exposed { path: PathBuf, mode: u32 },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tokens: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    token: String,
    /// Project ids, or `"*"` for every project.
    projects: Vec<String>,
    #[serde(default = "read_write")]
    access: String,
    /// Who or what holds the token (shown in the server log, never the token).
    #[serde(default)]
    name: String,
}

fn read_write() -> String {
    "read-write".into()
}

#[derive(Clone, Debug)]
struct Grant {
    name: String,
    all_projects: bool,
    projects: Vec<String>,
    write: bool,
}

/// The tokens the server accepts, keyed by the SHA-256 of the token (a lookup by hash does
/// not compare secrets byte by byte).
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    grants: HashMap<[u8; 32], Grant>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Read and check the tokens file: refused when other users may read or change it, or
    /// when it does not parse.
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let read_err = |source: std::io::Error| TokensError::Read { path: path.to_owned(), source };
        let mut file = std::fs::File::open(path).map_err(read_err)?;
        // The mode of the file that is read (not of a path that may change in between).
        let mode = file.metadata().map_err(read_err)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokensError::Exposed { path: path.to_owned(), mode });
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(read_err)?;
        Tokens::parse(&text).map_err(|message| TokensError::Invalid { path: path.to_owned(), message })
    }

    pub fn parse(text: &str) -> Result<Tokens, String> {
        let file: File = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            match line {
                Some(l) => format!("line {l}: {}", e.message()),
                None => e.message().to_string(),
            }
        })?;
        let mut grants = HashMap::new();
        for (i, e) in file.tokens.into_iter().enumerate() {
            let at = |m: &str| format!("tokens[{i}]: {m}");
            if e.token.len() < 16 {
                return Err(at("token must be at least 16 characters"));
            }
            if e.projects.is_empty() {
                return Err(at("projects must list at least one project (or \"*\")"));
            }
            let write = match e.access.as_str() {
                "read-write" => true,
                "read-only" => false,
                other => return Err(at(&format!("access must be \"read-only\" or \"read-write\", not {other:?}"))),
            };
            let grant = Grant {
                name: if e.name.is_empty() { format!("tokens[{i}]") } else { e.name },
                all_projects: e.projects.iter().any(|p| p == "*"),
                projects: e.projects,
                write,
            };
            if grants.insert(digest(&e.token), grant).is_some() {
                return Err(at("the same token is listed twice"));
            }
        }
        Ok(Tokens { grants })
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// Check a request's `Authorization` header for `project`; `write` for methods that
    /// change something. Returns the holder's name.
    pub fn check(&self, authorization: Option<&str>, project: &str, write: bool) -> Result<String, ApiError> {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::unauthenticated(
                    "Request is missing required authentication credential. Expected an \"Authorization: Bearer TOKEN\" header.",
                )
            })?;
        let grant = self
            .grants
            .get(&digest(token))
            .ok_or_else(|| ApiError::unauthenticated("Request had invalid authentication credentials."))?;
        if !grant.all_projects && !grant.projects.iter().any(|p| p == project) {
            return Err(ApiError::permission_denied(format!(
                "Permission denied on project \"{project}\" (or it may not exist)."
            )));
        }
        if write && !grant.write {
            return Err(ApiError::permission_denied(format!("The token may only read project \"{project}\".")));
        }
        Ok(grant.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[tokens]]
token = "aaaaaaaaaaaaaaaaaaaa"
projects = ["p1", "p2"]
name = "ci"

[[tokens]]
token = "rrrrrrrrrrrrrrrrrrrr"
projects = ["*"]
access = "read-only"
"#;

    #[test]
    fn grants() {
        let t = Tokens::parse(FILE).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.check(Some("Bearer aaaaaaaaaaaaaaaaaaaa"), "p1", true).unwrap(), "ci");
        let e = t.check(Some("Bearer aaaaaaaaaaaaaaaaaaaa"), "p3", false).unwrap_err();
        assert_eq!(e.http_status(), 403);
        let e = t.check(None, "p1", false).unwrap_err();
        assert_eq!(e.http_status(), 401);
        let e = t.check(Some("Bearer nope-nope-nope-nope"), "p1", false).unwrap_err();
        assert_eq!(e.http_status(), 401);
        assert!(t.check(Some("Bearer rrrrrrrrrrrrrrrrrrrr"), "anything", false).is_ok());
        let e = t.check(Some("Bearer rrrrrrrrrrrrrrrrrrrr"), "anything", true).unwrap_err();
        assert_eq!(e.http_status(), 403);
    }

    #[test]
    fn bad_files_name_the_entry() {
        assert!(Tokens::parse("[[tokens]]\ntoken = \"short\"\nprojects = [\"p\"]\n").unwrap_err().contains("tokens[0]"));
        assert!(Tokens::parse("[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nprojects = []\n").unwrap_err().contains("projects"));
        assert!(Tokens::parse("[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nprojects = [\"p\"]\naccess = \"admin\"\n").unwrap_err().contains("access"));
        let e = Tokens::parse("[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nprojets = [\"p\"]\n").unwrap_err();
        assert!(e.contains("line 3") && e.contains("projets"), "{e}");
    }

    #[test]
    fn an_exposed_file_is_refused_with_its_mode_and_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.toml");
        std::fs::write(&p, FILE).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Tokens::load(&p).unwrap_err().to_string();
            assert!(e.contains(&format!("mode {mode:04o}")) && e.contains(&format!("chmod 600 {}", p.display())), "{e}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(Tokens::load(&p).unwrap().len(), 2);
        }
    }
}
