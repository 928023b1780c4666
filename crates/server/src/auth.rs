//! Bearer tokens: a tokens file maps each token to the projects it may use, read-only or
//! read-write. No or an unknown token: 401 UNAUTHENTICATED; a project the token may not
//! use, or a write with a read-only token: 403 PERMISSION_DENIED. Without a tokens file the
//! server is open, and `serve` allows that only on a loopback address.
//!
//! The file holds secrets: one that other users may read or change (any group or other
//! permission bit) is refused, with the fix (`chmod 600 FILE`). Each token must be strong
//! ([`weakness`]): at least 16 characters, at least 8 different ones, not one pattern
//! repeated and not a run of consecutive characters. Errors name the entry by its `name`
//! and its line, never by the token. [`TokenStore`] holds the tokens in force and reads
//! the file again on demand (SIGHUP, `POST /v1/admin/tokens:reload`); a file that cannot
//! be used changes nothing.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use trainyard_api::ApiError;

/// Shortest token, in characters.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Fewest different characters in a token.
pub const MIN_DISTINCT_CHARS: usize = 8;

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
    /// The secret, with its place in the file (for errors that name the line, not the token).
    token: toml::Spanned<String>,
    /// Project ids, or `"*"` for every project.
    projects: Vec<String>,
    #[serde(default = "read_write")]
    access: String,
    /// Who or what holds the token (shown in the server log, never the token).
    #[serde(default)]
    name: String,
    /// The token may create jobs that see directories of the server's host
    /// (`trainyardHostDirectories`, sent by `custom-jobs create --config` on this host).
    #[serde(default)]
    host_directories: bool,
}

fn read_write() -> String {
    "read-write".into()
}

#[derive(Clone, Debug)]
pub(crate) struct Grant {
    name: String,
    all_projects: bool,
    projects: Vec<String>,
    write: bool,
    host_directories: bool,
}

/// The tokens the server accepts, keyed by the SHA-256 of the token (a lookup by hash does
/// not compare secrets byte by byte), and the credentials of live jobs.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    grants: HashMap<[u8; 32], Grant>,
    jobs: Option<Arc<JobCredentials>>,
}

/// What a request's `Authorization` header carries.
pub(crate) enum Bearer<'a> {
    None,
    Unknown,
    /// A job credential that is not that of a running job: forged, or its job has ended
    /// (or never ran here). One answer for all, so that it tells nothing of which jobs run.
    NotRunningJob,
    Known(Cow<'a, Grant>),
}

impl Bearer<'_> {
    /// The holder's name, or None when the header carries no known token.
    pub fn holder(&self) -> Option<&str> {
        match self {
            Bearer::Known(g) => Some(&g.name),
            _ => None,
        }
    }

    /// The projects the token may use (`"*"` for all), or None when it is not known.
    pub fn projects(&self) -> Option<&[String]> {
        match self {
            Bearer::Known(g) => Some(&g.projects),
            _ => None,
        }
    }
}

/// Per-job credentials, in tokens mode: each replica's clients find one (a
/// `GOOGLE_APPLICATION_CREDENTIALS` file, see `driver::launch`) and the server accepts it
/// as a read-write token of the job's project while the job has not ended. A credential
/// is `tyj1.<job>.<mac>`, the MAC (HMAC-SHA256, a key kept in the database) binding the
/// job to its project: nothing is stored per job, and a restarted server accepts the
/// credentials of the jobs it recovers.
#[derive(Debug)]
pub struct JobCredentials {
    key: Vec<u8>,
    /// Live jobs and their projects (kept by the driver).
    live: RwLock<HashMap<u64, String>>,
}

const JOB_CREDENTIAL_PREFIX: &str = "tyj1.";

/// The one answer to a job credential that is not accepted, forged or its job ended: the
/// same words and status either way, so that a guess tells nothing of which jobs run.
const NOT_A_RUNNING_JOB: &str =
    "Request had invalid authentication credentials: a job's credential is accepted only while its job runs.";

impl JobCredentials {
    pub fn new(key: &[u8]) -> JobCredentials {
        // A key of its own, derived from the one given (the page tokens' key).
        let key = mac(key, b"trainyard job credentials v1").to_vec();
        JobCredentials { key, live: RwLock::new(HashMap::new()) }
    }

    /// What a job's MAC is computed over: the job and its project.
    fn job_message(job: u64, project: &str) -> Vec<u8> {
        let mut msg = job.to_be_bytes().to_vec();
        msg.extend_from_slice(project.as_bytes());
        msg
    }

    /// The credential of `job` of `project`.
    pub fn credential(&self, job: u64, project: &str) -> String {
        let mac: String = mac(&self.key, &Self::job_message(job, project)).iter().map(|b| format!("{b:02x}")).collect();
        format!("{JOB_CREDENTIAL_PREFIX}{job}.{mac}")
    }

    /// The job is live (its credential is accepted).
    pub fn live(&self, job: u64, project: &str) {
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        live.insert(job, project.to_string());
    }

    /// The job has ended (its credential is refused from now on).
    pub fn ended(&self, job: u64) {
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        live.remove(&job);
    }

    /// What `token` is: not a job credential (None), the credential of an ended job, or
    /// a grant of its live job's project.
    fn grant(&self, token: &str) -> Option<Bearer<'static>> {
        let rest = token.strip_prefix(JOB_CREDENTIAL_PREFIX)?;
        let (job, given) = rest.split_once('.')?;
        let job: u64 = job.parse().ok()?;
        let project = {
            let live = self.live.read().unwrap_or_else(|p| p.into_inner());
            live.get(&job).cloned()
        };
        let Some(project) = project else {
            // Ended, or never made here: either way not a credential for now (the MAC
            // cannot be checked without the project, which is gone with the job), said as
            // a forged one is.
            return Some(Bearer::NotRunningJob);
        };
        // The MAC, as `credential` writes it (lowercase hex), checked in constant time
        // (`verify_slice`).
        let lowercase_hex = given.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
        let genuine = keyed(&self.key, &Self::job_message(job, &project))
            .zip(crate::unhex(given).filter(|_| lowercase_hex))
            .is_some_and(|(m, given)| hmac::Mac::verify_slice(m, &given).is_ok());
        if !genuine {
            return Some(Bearer::NotRunningJob);
        }
        Some(Bearer::Known(Cow::Owned(Grant {
            name: format!("job {job}"),
            all_projects: false,
            projects: vec![project],
            write: true,
            host_directories: false,
        })))
    }
}

/// HMAC-SHA256 of `msg` under `key`, to finalize or verify (never None: HMAC takes keys
/// of any length).
fn keyed(key: &[u8], msg: &[u8]) -> Option<hmac::Hmac<Sha256>> {
    use hmac::Mac;
    let mut m = <hmac::Hmac<Sha256> as Mac>::new_from_slice(key).ok()?;
    m.update(msg);
    Some(m)
}

fn mac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use hmac::Mac;
    match keyed(key, msg) {
        Some(m) => m.finalize().into_bytes().into(),
        None => Sha256::digest([key, msg].concat()).into(),
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Why a token is too weak to be accepted, or None when it is strong enough: fewer than
/// [`MIN_TOKEN_CHARS`] characters, fewer than [`MIN_DISTINCT_CHARS`] different characters,
/// one shorter pattern repeated (`abcdefghabcdefgh`), or a run of characters that each
/// differ from the one before by the same step (`0123456789abcdef`, `aaaa...`).
pub fn weakness(token: &str) -> Option<String> {
    let chars: Vec<char> = token.chars().collect();
    let n = chars.len();
    if n < MIN_TOKEN_CHARS {
        return Some(format!("it is shorter than {MIN_TOKEN_CHARS} characters"));
    }
    let distinct: HashSet<char> = chars.iter().copied().collect();
    if distinct.len() < MIN_DISTINCT_CHARS {
        return Some(format!("it has fewer than {MIN_DISTINCT_CHARS} different characters"));
    }
    if (1..n).any(|period| n % period == 0 && (period..n).all(|i| chars[i] == chars[i - period])) {
        return Some("it is one shorter pattern repeated".into());
    }
    let step = |i: usize| i64::from(u32::from(chars[i])) - i64::from(u32::from(chars[i - 1]));
    if (2..n).all(|i| step(i) == step(1)) {
        return Some("it is a run of consecutive characters".into());
    }
    None
}

/// The 1-based line of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.get(..at.min(text.len())).unwrap_or(text).matches('\n').count() + 1
}

impl Tokens {
    /// Read and check the tokens file: refused when other users may read or change it,
    /// when it does not parse, or when a token is weak.
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
        let file: File = toml::from_str(text).map_err(|e| match e.span() {
            Some(s) => format!("line {}: {}", line_of(text, s.start), e.message()),
            None => e.message().to_string(),
        })?;
        let mut grants = HashMap::new();
        for (i, e) in file.tokens.into_iter().enumerate() {
            let name = if e.name.is_empty() { format!("tokens[{i}]") } else { e.name };
            let line = line_of(text, e.token.span().start);
            // The entry by its line and holder, never by its secret.
            let at = |m: &str| format!("line {line} (token {name:?}): {m}");
            if let Some(why) = weakness(e.token.get_ref()) {
                return Err(at(&format!(
                    "the token is too weak: {why}; use at least {MIN_TOKEN_CHARS} random characters \
                     (e.g. `openssl rand -hex 24`)"
                )));
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
                all_projects: e.projects.iter().any(|p| p == "*"),
                projects: e.projects,
                write,
                host_directories: e.host_directories && write,
                name: name.clone(),
            };
            if grants.insert(digest(e.token.get_ref()), grant).is_some() {
                return Err(at("the same token is listed twice"));
            }
        }
        Ok(Tokens { grants, jobs: None })
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// The bearer token of an `Authorization` header, if any.
    fn bearer(authorization: Option<&str>) -> Option<&str> {
        authorization
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }

    /// What the `Authorization` header carries: a token of the file, a live job's
    /// credential, or neither. Looked up once per request (a digest, or a MAC for a job's
    /// credential): the guard passes it on (`check_bearer`, `Bearer::projects`).
    pub(crate) fn lookup(&self, authorization: Option<&str>) -> Bearer<'_> {
        let Some(token) = Tokens::bearer(authorization) else { return Bearer::None };
        if let Some(g) = self.grants.get(&digest(token)) {
            return Bearer::Known(Cow::Borrowed(g));
        }
        self.jobs.as_ref().and_then(|j| j.grant(token)).unwrap_or(Bearer::Unknown)
    }

    fn known(&self, authorization: Option<&str>) -> Option<Cow<'_, Grant>> {
        match self.lookup(authorization) {
            Bearer::Known(g) => Some(g),
            _ => None,
        }
    }

    /// Who holds the token of an `Authorization` header: its `name` (`job N` for a job's
    /// credential), or None when the header carries no known token.
    pub fn holder(&self, authorization: Option<&str>) -> Option<String> {
        self.known(authorization).map(|g| g.name.clone())
    }

    /// May the token of an `Authorization` header create jobs that see directories of the
    /// server's host (`host_directories = true`, on a read-write token)?
    pub fn allows_host_directories(&self, authorization: Option<&str>) -> bool {
        self.known(authorization).is_some_and(|g| g.host_directories)
    }

    /// The projects the token of an `Authorization` header may use (`"*"` for all), or
    /// None when the header carries no known token.
    pub fn projects_of(&self, authorization: Option<&str>) -> Option<Vec<String>> {
        self.known(authorization).map(|g| g.projects.clone())
    }

    /// Check a request's `Authorization` header for `project`; `write` for methods that
    /// change something. Returns the holder's name.
    pub fn check(&self, authorization: Option<&str>, project: &str, write: bool) -> Result<String, ApiError> {
        Tokens::check_bearer(self.lookup(authorization), project, write)
    }

    /// [`Tokens::check`] of a token already looked up.
    pub(crate) fn check_bearer(bearer: Bearer<'_>, project: &str, write: bool) -> Result<String, ApiError> {
        let grant = match bearer {
            Bearer::None => {
                return Err(ApiError::unauthenticated(
                    "Request is missing required authentication credential. Expected an \"Authorization: Bearer TOKEN\" header.",
                ))
            }
            Bearer::Unknown => return Err(ApiError::unauthenticated("Request had invalid authentication credentials.")),
            Bearer::NotRunningJob => return Err(ApiError::unauthenticated(NOT_A_RUNNING_JOB)),
            Bearer::Known(g) => g,
        };
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

/// What a reload changed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Reloaded {
    /// Tokens in force now.
    pub tokens: usize,
    /// Tokens that were not in force before.
    pub added: usize,
    /// Tokens no longer accepted.
    pub removed: usize,
}

/// The tokens in force and the file they come from; [`TokenStore::reload`] replaces them
/// all at once, or not at all.
#[derive(Debug)]
pub struct TokenStore {
    path: PathBuf,
    current: RwLock<Arc<Tokens>>,
    /// Jobs' credentials, accepted next to the file's tokens once the engine gives them.
    jobs: OnceLock<Arc<JobCredentials>>,
}

impl TokenStore {
    pub fn open(path: &Path) -> Result<TokenStore, TokensError> {
        let tokens = Tokens::load(path)?;
        Ok(TokenStore { path: path.to_owned(), current: RwLock::new(Arc::new(tokens)), jobs: OnceLock::new() })
    }

    /// Accept the credentials of live jobs (see [`JobCredentials`]) from now on.
    pub fn accept_job_credentials(&self, jobs: Arc<JobCredentials>) {
        let jobs = Arc::clone(self.jobs.get_or_init(|| jobs));
        let mut slot = self.current.write().unwrap_or_else(|p| p.into_inner());
        let mut tokens = Tokens::clone(&slot);
        tokens.jobs = Some(jobs);
        *slot = Arc::new(tokens);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tokens in force.
    pub fn current(&self) -> Arc<Tokens> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            // A writer never panics while it holds the lock (it only swaps an Arc).
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Read the file again; the new tokens replace the old ones only when the whole file
    /// is good, else nothing changes and the error says why.
    pub fn reload(&self) -> Result<Reloaded, TokensError> {
        let mut new = Tokens::load(&self.path)?;
        new.jobs = self.jobs.get().cloned();
        let new = Arc::new(new);
        let mut slot = match self.current.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let added = new.grants.keys().filter(|k| !slot.grants.contains_key(*k)).count();
        let removed = slot.grants.keys().filter(|k| !new.grants.contains_key(*k)).count();
        let reloaded = Reloaded { tokens: new.len(), added, removed };
        *slot = new;
        Ok(reloaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CI: &str = "ci-7f3a9c2e41d8b605";
    const RO: &str = "ro-e19b74c05a2f3d68";

    fn file() -> String {
        format!(
            "\n[[tokens]]\ntoken = \"{CI}\"\nprojects = [\"p1\", \"p2\"]\nname = \"ci\"\n\n\
             [[tokens]]\ntoken = \"{RO}\"\nprojects = [\"*\"]\naccess = \"read-only\"\n"
        )
    }

    fn entry(token: &str) -> String {
        format!("[[tokens]]\nname = \"lab\"\ntoken = \"{token}\"\nprojects = [\"p\"]\n")
    }

    #[test]
    fn grants() {
        let t = Tokens::parse(&file()).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.check(Some(&format!("Bearer {CI}")), "p1", true).unwrap(), "ci");
        let e = t.check(Some(&format!("Bearer {CI}")), "p3", false).unwrap_err();
        assert_eq!(e.http_status(), 403);
        let e = t.check(None, "p1", false).unwrap_err();
        assert_eq!(e.http_status(), 401);
        let e = t.check(Some("Bearer nope-nope-nope-nope"), "p1", false).unwrap_err();
        assert_eq!(e.http_status(), 401);
        assert!(t.check(Some(&format!("Bearer {RO}")), "anything", false).is_ok());
        let e = t.check(Some(&format!("Bearer {RO}")), "anything", true).unwrap_err();
        assert_eq!(e.http_status(), 403);
        assert_eq!(t.holder(Some(&format!("Bearer {CI}"))).as_deref(), Some("ci"));
        assert_eq!(t.holder(Some(&format!("Bearer {RO}"))).as_deref(), Some("tokens[1]"));
        assert_eq!(t.holder(Some("Bearer nope-nope-nope-nope")).as_deref(), None);
        assert_eq!(t.holder(None).as_deref(), None);
    }

    #[test]
    fn bad_files_name_the_entry() {
        let e = Tokens::parse("[[tokens]]\ntoken = \"sh0rt-t0ken\"\nprojects = [\"p\"]\n").unwrap_err();
        assert!(e.contains("tokens[0]") && e.contains("line 2"), "{e}");
        assert!(Tokens::parse(&format!("[[tokens]]\ntoken = \"{CI}\"\nprojects = []\n")).unwrap_err().contains("projects"));
        let e = Tokens::parse(&format!("[[tokens]]\ntoken = \"{CI}\"\nprojects = [\"p\"]\naccess = \"admin\"\n")).unwrap_err();
        assert!(e.contains("access"), "{e}");
        let e = Tokens::parse(&format!("[[tokens]]\ntoken = \"{CI}\"\nprojets = [\"p\"]\n")).unwrap_err();
        assert!(e.contains("line 3") && e.contains("projets"), "{e}");
        let e = Tokens::parse(&format!("{}\n{}", entry(CI), entry(CI))).unwrap_err();
        assert!(e.contains("twice") && e.contains("line 8") && !e.contains(CI), "{e}");
    }

    /// Weak tokens are refused by the rule, naming the holder and the line, never the token.
    #[test]
    fn weak_tokens_are_refused_without_showing_them() {
        let weak = [
            ("abc123xyz", "shorter than 16"),
            ("aaaaaaaaaaaaaaaaaaaa", "fewer than 8 different"),
            ("abababababababababab", "fewer than 8 different"),
            ("abcdefghabcdefgh", "pattern repeated"),
            ("abcdefghijklmnopqrst", "consecutive"),
            ("zyxwvutsrqponmlk", "consecutive"),
        ];
        for (token, why) in weak {
            let text = format!("# tokens\n\n{}", entry(token));
            let e = Tokens::parse(&text).unwrap_err();
            assert!(e.contains(why) && e.contains("\"lab\"") && e.contains("line 5") && !e.contains(token), "{token}: {e}");
        }
        for strong in [CI, RO, "rw-token-0123456789abcdef", "Zq8-v!Lm2#xT9pWc", "correct horse battery staple"] {
            assert_eq!(weakness(strong), None, "{strong}");
        }
        // Characters, not bytes: 15 two-byte characters are too short.
        assert!(weakness("äöüßéèêëàáâãåçñ").is_some_and(|w| w.contains("shorter")));
    }

    #[test]
    fn an_exposed_file_is_refused_with_its_mode_and_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.toml");
        std::fs::write(&p, file()).unwrap();
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

    #[test]
    fn a_jobs_credential_is_its_projects_while_the_job_is_live() {
        let jobs = Arc::new(JobCredentials::new(b"page token key"));
        let mut t = Tokens::parse(&file()).unwrap();
        t.jobs = Some(Arc::clone(&jobs));
        let cred = jobs.credential(7, "p1");
        let bearer = format!("Bearer {cred}");
        // Not live (yet, or any more): refused, as a forged one is (no oracle of which
        // jobs run).
        let e = t.check(Some(&bearer), "p1", false).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (trainyard_api::Code::Unauthenticated, NOT_A_RUNNING_JOB));
        jobs.live(7, "p1");
        assert_eq!(t.check(Some(&bearer), "p1", true).unwrap(), "job 7");
        assert_eq!(t.holder(Some(&bearer)).as_deref(), Some("job 7"));
        assert_eq!(t.lookup(Some(&bearer)).projects(), Some(&["p1".to_string()][..]));
        assert!(!t.allows_host_directories(Some(&bearer)));
        // Its project only.
        assert_eq!(t.check(Some(&bearer), "p2", false).unwrap_err().code, trainyard_api::Code::PermissionDenied);
        // Another job's number with this MAC, or this job under another project: refused.
        let forged = cred.replacen("tyj1.7.", "tyj1.8.", 1);
        let not_running = t.check(Some(&format!("Bearer {forged}")), "p1", false).unwrap_err();
        jobs.live(8, "p1");
        let running = t.check(Some(&format!("Bearer {forged}")), "p1", false).unwrap_err();
        assert_eq!((running.code, running.message.as_str()), (trainyard_api::Code::Unauthenticated, NOT_A_RUNNING_JOB));
        assert_eq!((not_running.code, &not_running.message), (running.code, &running.message), "a forged credential tells nothing of whether job 8 runs");
        let elsewhere = jobs.credential(7, "p2");
        assert_eq!(t.check(Some(&format!("Bearer {elsewhere}")), "p1", false).unwrap_err().code, trainyard_api::Code::Unauthenticated);
        // Another server's key: refused.
        let other = JobCredentials::new(b"another key").credential(7, "p1");
        assert_eq!(t.check(Some(&format!("Bearer {other}")), "p1", false).unwrap_err().code, trainyard_api::Code::Unauthenticated);
        jobs.ended(7);
        assert_eq!(t.check(Some(&bearer), "p1", false).unwrap_err().message, NOT_A_RUNNING_JOB);
    }

    #[test]
    fn reload_keeps_accepting_jobs_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, file()).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let store = TokenStore::open(&path).unwrap();
        let jobs = Arc::new(JobCredentials::new(b"k"));
        store.accept_job_credentials(Arc::clone(&jobs));
        jobs.live(3, "p1");
        let bearer = format!("Bearer {}", jobs.credential(3, "p1"));
        assert!(store.current().check(Some(&bearer), "p1", true).is_ok());
        store.reload().unwrap();
        assert!(store.current().check(Some(&bearer), "p1", true).is_ok());
    }

    #[test]
    fn reload_replaces_all_or_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.toml");
        let write = |text: &str| {
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        write(&file());
        let store = TokenStore::open(&p).unwrap();
        let new = "nw-5c0e8d2b7a4f9136";
        write(&format!("[[tokens]]\ntoken = \"{CI}\"\nprojects = [\"p1\"]\nname = \"ci\"\n\n{}", entry(new)));
        assert_eq!(store.reload().unwrap(), Reloaded { tokens: 2, added: 1, removed: 1 });
        assert_eq!(store.current().holder(Some(&format!("Bearer {new}"))).as_deref(), Some("lab"));
        assert_eq!(store.current().holder(Some(&format!("Bearer {RO}"))), None);
        // A broken file changes nothing.
        write(&entry("too-short"));
        assert!(store.reload().is_err());
        assert_eq!(store.current().holder(Some(&format!("Bearer {new}"))).as_deref(), Some("lab"));
        write(&file());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(store.reload(), Err(TokensError::Exposed { .. })));
        assert_eq!(store.current().len(), 2);
        assert_eq!(store.current().holder(Some(&format!("Bearer {CI}"))).as_deref(), Some("ci"));
    }
}
